"""Symbol tables as numpy columns, for symbolizing many addresses at once.

A decoded trace has millions of instruction addresses; turning them into
``function+offset`` one dictionary lookup at a time is the slow part of every
report.  A :class:`SymbolTable` keeps the symbols sorted by start address in
numpy arrays, so :meth:`SymbolTable.lookup` resolves a whole array of
addresses with one ``np.searchsorted``.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterable, Sequence

import numpy as np

from ..columns import distinct

#: index_of looks many addresses up through a memo of those it met
#: before (slots of a direct-mapped cache, one per thread: a slot is two
#: words; from this many addresses on).
_MEMO_SLOTS = 1 << 14
_MEMO_FROM = 256

__all__ = ["FUNCTION", "IFUNC", "OBJECT", "SymbolTable"]

OBJECT = 0
FUNCTION = 1
# An ELF STT_GNU_IFUNC symbol: code, but its address is the resolver that
# picks the implementation, not the function a caller means.
IFUNC = 2


def _in_order(start: np.ndarray, size: np.ndarray) -> bool:
    """Whether symbols are sorted by start, the larger first where starts
    are equal (the order lexsort gives; stable, so the same rows)."""
    if start.shape[0] < 2:
        return True
    later, earlier = start[1:], start[:-1]
    return bool(np.all((later > earlier) | ((later == earlier) & (size[1:] <= size[:-1]))))


def address_number(text: str) -> int:
    """An address or offset a user types (``func+off``, ``0x401000``):
    hexadecimal after ``0x``, else decimal (``main+010`` is 10 bytes in,
    not octal).  ValueError when it is neither."""
    return int(text, 16) if text[:2].lower() == "0x" else int(text, 10)


class SymbolTable:
    """Symbols with a nonzero size, sorted by start address.

    Columns (all the same length): ``start`` and ``size`` (uint64), ``kind``
    (uint8, :data:`FUNCTION` or :data:`OBJECT`), ``name_index`` into
    ``names`` and ``module`` into ``modules`` (the file each symbol comes
    from, e.g. ``libc.so.6``).  Symbols may nest or overlap; a lookup then
    prefers the one that starts last.
    """

    def __init__(
        self,
        start: np.ndarray,
        size: np.ndarray,
        name_index: np.ndarray,
        names: Sequence[str],
        kind: np.ndarray | None = None,
        module: np.ndarray | None = None,
        modules: Sequence[str] = ("",),
    ) -> None:
        start = np.asarray(start, dtype=np.uint64)
        size = np.asarray(size, dtype=np.uint64)
        count = start.shape[0]
        name_index = np.asarray(name_index, dtype=np.int32)
        kind = np.full(count, FUNCTION, np.uint8) if kind is None else np.asarray(kind, np.uint8)
        module = np.zeros(count, np.int32) if module is None else np.asarray(module, np.int32)
        # Sort by start, larger symbols first, so that the last symbol
        # starting at or before an address is the innermost one.  Tables
        # made from a table (relocated, a subset) are in that order already:
        # a check costs a fraction of the sort.
        if _in_order(start, size):
            self.start, self.size, self.name_index = start.copy(), size.copy(), name_index.copy()
            self.kind, self.module = kind.copy(), module.copy()
        else:
            order = np.lexsort((~size, start))
            self.start = start[order]
            self.size = size[order]
            self.name_index = name_index[order]
            self.kind = kind[order]
            self.module = module[order]
        self.names = list(names)
        self.modules = list(modules)
        # Per module, how far its symbols were moved from their link
        # addresses (relocate): what an address in a symbol's name (an
        # IRELATIVE stub's ``*ABS*+0x9f1c0@plt``) is relative to.
        self.biases = [0] * len(self.modules)
        self.end = self.start + self.size
        # cover[i]: among symbols 0..i, one whose end is the largest; it is
        # the fallback when symbol i does not reach an address but an
        # earlier, longer symbol does.
        running = np.maximum.accumulate(self.end) if count else self.end
        holder = np.where(self.end == running, np.arange(count), 0)
        self._cover = np.maximum.accumulate(holder) if count else holder
        self._functions: SymbolTable | None = None
        # (per thread, addresses looked up before and their answers, see
        # index_of)
        self._memo: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def empty(cls) -> SymbolTable:
        """A table without symbols."""
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.int32), [])

    @classmethod
    def from_symbols(
        cls, symbols: Iterable[tuple[int, int, str, bool]], module: str = ""
    ) -> SymbolTable:
        """Build a table from ``(start, size, name, is_function)`` tuples; zero sizes are dropped."""
        rows = [row for row in symbols if row[1] > 0]
        return cls(
            np.array([r[0] for r in rows], np.uint64),
            np.array([r[1] for r in rows], np.uint64),
            np.arange(len(rows), dtype=np.int32),
            [r[2] for r in rows],
            np.array([FUNCTION if r[3] else OBJECT for r in rows], np.uint8),
            np.zeros(len(rows), np.int32),
            [module],
        )

    @classmethod
    def merge(cls, tables: Iterable[SymbolTable]) -> SymbolTable:
        """One table holding the symbols of several (e.g. one per loaded file)."""
        tables = [t for t in tables if len(t)]
        if not tables:
            return cls.empty()
        names: list[str] = []
        modules: list[str] = []
        name_index, module = [], []
        for table in tables:
            name_index.append(table.name_index + len(names))
            module.append(table.module + len(modules))
            names.extend(table.names)
            modules.extend(table.modules)
        # Tables of address ranges that do not interleave (one a mapped
        # file, the kernel's, the JIT code's) are in order one after
        # another: laid end to end by address they need no sort (a
        # process's image is merged again at each mapping it adds).
        seq = sorted(range(len(tables)), key=lambda i: int(tables[i].start[0]))
        if any(int(tables[a].start[-1]) >= int(tables[b].start[0])
               for a, b in itertools.pairwise(seq)):  # fmt: skip
            seq = list(range(len(tables)))
        out = cls(
            np.concatenate([tables[i].start for i in seq]),
            np.concatenate([tables[i].size for i in seq]),
            np.concatenate([name_index[i] for i in seq]),
            names,
            np.concatenate([tables[i].kind for i in seq]),
            np.concatenate([module[i] for i in seq]),
            modules,
        )
        out.biases = [b for t in tables for b in t.biases]
        return out

    def relocate(self, bias: int, module: str | None = None) -> SymbolTable:
        """The same symbols moved by ``bias`` (modulo 2**64), optionally renamed to ``module``."""
        start = self.start + np.uint64(bias % (1 << 64))
        if module is None:
            out = SymbolTable(
                start, self.size, self.name_index, self.names, self.kind, self.module, self.modules
            )
            out.biases = [b + bias for b in self.biases]
            return out
        out = SymbolTable(
            start,
            self.size,
            self.name_index,
            self.names,
            self.kind,
            np.zeros(len(self), np.int32),
            [module],
        )
        out.biases = [(self.biases[0] if self.biases else 0) + bias]
        return out

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @property
    def functions(self) -> SymbolTable:
        """The function symbols only (what code addresses should resolve to)."""
        if self._functions is None:
            self._functions = self.subset(self.kind != OBJECT)
        return self._functions

    def subset(self, keep: np.ndarray) -> SymbolTable:
        """The symbols where the boolean array ``keep`` is true."""
        table = SymbolTable(
            self.start[keep],
            self.size[keep],
            self.name_index[keep],
            self.names,
            self.kind[keep],
            self.module[keep],
            self.modules,
        )
        table.biases = list(self.biases)  # per module, and the modules are the same
        return table

    def lookup(self, addresses: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Resolve addresses to ``(index, offset)`` arrays; index -1 where no symbol covers.

        ``offset`` is the address minus the symbol's start (0 where index is -1).
        """
        addr = np.asarray(addresses, dtype=np.uint64)
        if len(self) == 0:
            return np.full(addr.shape, -1, np.int64), np.zeros(addr.shape, np.uint64)
        index = self.index_of(addr)
        found = index >= 0
        offset = np.where(found, addr - self.start[np.where(found, index, 0)], np.uint64(0))
        return index, offset.astype(np.uint64)

    def index_of(self, addresses: np.ndarray | Sequence[int]) -> np.ndarray:
        """The symbol index of each address, -1 where no symbol covers it
        (:meth:`lookup` without the offsets)."""
        addr = np.ascontiguousarray(addresses, dtype=np.uint64)
        if len(self) == 0 or addr.shape[0] == 0:
            return np.full(addr.shape, -1, np.int64)
        if addr.ndim != 1:  # a scalar, or several dimensions
            return self.index_of(addr.reshape(-1)).reshape(addr.shape)
        from ._lookup import lookup_index, lookup_index_memo

        out = np.empty(addr.shape[0], np.int64)
        cover = np.asarray(self._cover, np.int64)
        if addr.shape[0] < _MEMO_FROM:
            lookup_index(self.start, self.end, cover, addr, out)
            return out
        memo = self._memo.get(threading.get_ident())
        if memo is None:
            # (every slot holds address 0 and its answer to begin with)
            zero = np.zeros(1, np.uint64)
            first = np.empty(1, np.int64)
            lookup_index(self.start, self.end, cover, zero, first)
            memo = np.zeros(_MEMO_SLOTS, np.uint64), np.full(_MEMO_SLOTS, first[0])
            self._memo[threading.get_ident()] = memo
        lookup_index_memo(self.start, self.end, cover, addr, out, *memo)
        return out

    def name(self, i: int) -> str:
        """The name of symbol ``i`` (an index from :meth:`lookup`)."""
        return self.names[int(self.name_index[i])]

    def module_name(self, i: int) -> str:
        """The file symbol ``i`` comes from (a path, for files a recording
        mapped: what perf script prints)."""
        return self.modules[int(self.module[i])]

    def qualified_name(self, i: int) -> str:
        """``module!name`` with the module's base name (``libc.so.6!qsort``,
        as ``-f`` takes it and perf report shows it), or just the name when
        the module is unnamed."""
        module = os.path.basename(self.module_name(i))
        return f"{module}!{self.name(i)}" if module else self.name(i)

    def symbolize(self, address: int, with_module: bool = False) -> str:
        """``"func+0x12"`` (``"func"`` at offset 0; ``"lib.so!func+0x12"`` with the module),
        or ``""`` when no symbol covers the address."""
        return self.symbolize_all(np.array([address], np.uint64), with_module)[0]

    def symbolize_all(self, addresses: np.ndarray, with_module: bool = False) -> list[str]:
        """:meth:`symbolize` of each of ``addresses``, looked up at once."""
        index, offset = self.lookup(addresses)
        out = []
        for i, off in zip(index.tolist(), offset.tolist(), strict=True):
            if i < 0:
                out.append("")
                continue
            name = self.qualified_name(i) if with_module else self.name(i)
            out.append(f"{name}+{off:#x}" if off else name)
        return out

    def function_entries(self, spec: str) -> np.ndarray:
        """The start addresses (sorted) of the functions named ``spec``:
        ``name``, or ``module!name`` with a module's base name
        (``libc.so.6!qsort``).  An IFUNC symbol's address is its resolver,
        not the function: it is left out (its calls come through PLT
        stubs, :meth:`ifunc_stubs`)."""
        module, _, name = spec.rpartition("!")
        named = [i for i, n in enumerate(self.names) if n == name]
        sel = np.isin(self.name_index, named) & (self.kind == FUNCTION) & (self.size > 0)
        if module:
            wanted = [i for i, m in enumerate(self.modules) if os.path.basename(m) == module]
            sel &= np.isin(self.module, wanted)
        return distinct(self.start[sel])

    def ifunc_stubs(self, spec: str) -> np.ndarray:
        """The start addresses (sorted) of the PLT stubs (``name@plt``, in
        any file) through which the IFUNC ``spec`` (``name``, or
        ``module!name``) is called: where a call of the implementation
        its resolver chose enters, the one sign of it before the flow
        shows where the stub goes.  Empty unless ``spec`` is an IFUNC."""
        module, _, name = spec.rpartition("!")
        named = [i for i, n in enumerate(self.names) if n == name]
        sel = np.isin(self.name_index, named) & (self.kind == IFUNC)
        if module:
            wanted = [i for i, m in enumerate(self.modules) if os.path.basename(m) == module]
            sel &= np.isin(self.module, wanted)
        if not sel.any():
            return np.zeros(0, np.uint64)
        # Other files call it by name; its own file through an IRELATIVE
        # slot, whose stub is named after the resolver's link address.
        parts = [self.function_entries(f"{name}@plt")]
        for i in np.flatnonzero(sel).tolist():
            m = int(self.module[i])
            link = (int(self.start[i]) - self.biases[m]) % (1 << 64)
            stub = f"*ABS*+{link:#x}@plt"
            mine = np.isin(self.name_index, [j for j, n in enumerate(self.names) if n == stub])
            parts.append(self.start[mine & (self.module == m) & (self.kind == FUNCTION)])
        return distinct(np.concatenate(parts))

    def __iter__(self):
        """Yield ``(start, size, name, is_function)`` in address order."""
        for i in range(len(self)):
            yield int(self.start[i]), int(self.size[i]), self.name(i), bool(self.kind[i])

    def __repr__(self) -> str:
        return f"SymbolTable({len(self)} symbols, {len(self.modules)} modules)"
