"""Loading ELF executables, shared objects and core files into an image.

The headers are numpy views of the file's memory map
(:class:`~hwtrace.image.elfheaders.ElfHeaders`); the bytes themselves are
never copied: each loadable segment becomes a
:class:`~hwtrace.image.sections.Section` over the map, and the symbol tables
are read as numpy record arrays straight from it.

What gets loaded is what Intel's ptxed loads: every ``PT_LOAD`` segment with
file bytes (``p_filesz`` > 0), ``p_filesz`` bytes of it.  The zero-filled
tail of a segment (``p_memsz`` > ``p_filesz``, e.g. ``.bss``) is not mapped:
it is never code.  ``executable_only=True`` keeps just the segments with
execute permission.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .ehframe import eh_frame_functions
from .elfheaders import PT_LOAD, ElfHeaders
from .plt import plt_symbols
from .sections import ANY, Asid, ImageError, Section
from .symbols import FUNCTION, IFUNC, OBJECT, SymbolTable

__all__ = ["ElfFile", "LoadedElf", "Segment", "c_strings", "load_elf", "read_elf"]

PF_X = 1
STT_OBJECT, STT_FUNC, STT_GNU_IFUNC = 1, 2, 10
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SHN_UNDEF, SHN_LORESERVE, SHN_XINDEX = 0, 0xFF00, 0xFFFF

_SYM_FIELDS = {
    64: [("name", "u4"), ("info", "u1"), ("other", "u1"), ("shndx", "u2"),
         ("value", "u8"), ("size", "u8")],
    32: [("name", "u4"), ("value", "u4"), ("size", "u4"), ("info", "u1"),
         ("other", "u1"), ("shndx", "u2")],
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Segment:
    """One ``PT_LOAD`` program header."""

    index: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    flags: int

    @property
    def executable(self) -> bool:
        return bool(self.flags & PF_X)


@dataclass(frozen=True, slots=True)
class ElfFile:
    """What an image needs from an ELF file, at its link addresses."""

    path: str
    elf_type: str  # "ET_EXEC", "ET_DYN", "ET_CORE", ...
    machine: str
    segments: tuple[Segment, ...]
    symbols: SymbolTable

    @property
    def min_vaddr(self) -> int:
        """The lowest ``PT_LOAD`` address: what a load address refers to."""
        return min(s.vaddr for s in self.segments)


@dataclass(frozen=True, slots=True)
class LoadedElf:
    """An ELF file as placed in an image: ``address = link address + bias``."""

    path: str
    name: str
    elf_type: str
    bias: int
    asid: Asid
    sections: tuple[Section, ...]
    symbols: SymbolTable  # relocated, module = ``name``


def read_elf(path: str | os.PathLike[str]) -> ElfFile:
    """Read the load segments and symbols of an ELF file.

    Raises :class:`ImageError` naming the file for a missing file, a file
    that is not ELF, and a truncated or malformed one.
    """
    name = os.fspath(path)
    key = _file_key(name)
    cached = _READ.get(key) if key is not None else None
    if cached is not None:
        return cached
    head = ElfHeaders(name)
    buf = head.buf
    total = buf.shape[0]
    try:
        segments = tuple(
            Segment(index=i, offset=int(ph["p_offset"]), vaddr=int(ph["p_vaddr"]),
                    filesz=int(ph["p_filesz"]), memsz=int(ph["p_memsz"]),
                    flags=int(ph["p_flags"]))
            for i, ph in enumerate(head.program_headers)
            if int(ph["p_type"]) == PT_LOAD
        )  # fmt: skip
        tables = head.symbol_tables()
        plt = plt_symbols(head)
        elfclass = head.elfclass
        little = head.little
        # Only dynamic symbols (a stripped library): the full table may
        # be in a detached debug file, as perf finds it.
        debug = None
        if not any(t[0] == ".symtab" for t in tables):
            debug = _detached_debug(head.build_id())
    except ImageError:
        raise
    except Exception as exc:  # numbers no well-formed file has
        raise ImageError(f"{name}: truncated or malformed ELF file: {exc}") from exc

    for seg in segments:
        if seg.filesz and seg.offset + seg.filesz > total:
            raise ImageError(
                f"{name}: truncated ELF file: segment {seg.index} at offset {seg.offset:#x} "
                f"(size {seg.filesz:#x}) extends beyond the end of the file ({total:#x})"
            )
    stored = _SymbolStore(key, debug)
    symbols = stored.load()
    if symbols is None:
        symbols = _read_symbols(name, buf, tables, elfclass, little)
        if debug is not None:
            try:
                dbg = ElfHeaders(debug)
                dtables = [t for t in dbg.symbol_tables() if t[0] == ".symtab"]
                if dtables:
                    extra = _read_symbols(debug, dbg.buf, dtables, elfclass, little)
                    symbols = SymbolTable.merge([symbols, extra])
            except Exception:  # a damaged debug file: the file's own symbols stand
                pass
        if plt:
            symbols = SymbolTable.merge([symbols, SymbolTable.from_symbols(
                (start, size, label, True) for start, size, label in plt
            )])  # fmt: skip
        try:
            unnamed = _unnamed_functions(head, symbols)
        except ImageError:
            unnamed = None
        if unnamed is not None:
            symbols = SymbolTable.merge([symbols, unnamed])
        stored.save(symbols)
    elf = ElfFile(name, head.elf_type, head.machine, segments, symbols)
    if key is not None:
        if len(_READ) >= _READ_MAX:
            del _READ[next(iter(_READ))]
        _READ[key] = elf
    return elf


def _unnamed_functions(head: ElfHeaders, symbols: SymbolTable) -> SymbolTable | None:
    """``sub_<address>`` for each function ``.eh_frame_hdr`` lists that no
    function symbol names: a stripped program's own functions (as IDA,
    Binary Ninja and angr name them), so its time is not one unknown.  A
    range holding a symbol's start (a PLT's stubs) is left to the symbols."""
    start, size = eh_frame_functions(head)
    if not start.shape[0]:
        return None
    code = symbols.functions
    named = np.sort(code.start)
    covered = code.index_of(start) >= 0
    # (the first named start after each range's start, if inside it)
    after = np.searchsorted(named, start, side="right")
    inside = after < named.shape[0]
    inside[inside] = named[after[inside]] < start[inside] + size[inside]
    keep = ~(covered | inside)
    if not keep.any():
        return None
    start, size = start[keep], size[keep]
    names = [f"sub_{a:x}" for a in start.tolist()]
    return SymbolTable(start, size, np.arange(len(names), dtype=np.int32), names)


# read_elf's results by file identity: a recording's libraries are read by
# the image, the symbol tables and the sideband alike.
_READ: dict[tuple, ElfFile] = {}
_READ_MAX = 256


def _file_key(name: str) -> tuple | None:
    try:
        st = os.stat(name)
    except OSError:
        return None
    # The path too: what is read names the file by it (a file renamed
    # keeps its identity but not its name).
    return (name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _SymbolStore:
    """An ELF file's symbol table kept in the user's cache (as perf keeps
    what it read of a binary in its build-id cache): a large library's
    takes ~10 ms to read (libc's 11,000 names, most from its debug file),
    ~1 ms to load.  Named by the file's identity and its debug file's
    (device, inode, size, time), so a changed file is read again;
    best effort, a cache that cannot be read or written costs that time
    only.  ``$HWTRACE_NO_SYMBOL_CACHE=1`` turns it off."""

    FORMAT = 2  # (2: with the functions of .eh_frame_hdr no symbol names)
    SMALL = 1 << 16  # files smaller than this are read, not cached
    KEEP = 256  # files the directory holds at most (the oldest go)

    def __init__(self, key: tuple | None, debug: str | None) -> None:
        self.path: str | None = None
        if key is None or key[3] < self.SMALL or os.environ.get("HWTRACE_NO_SYMBOL_CACHE") == "1":
            return
        from ..aot import user_cache_path

        # (the file's identity, not its path: a file reached by two paths
        # is one entry)
        parts = [os.path.basename(key[0])[:48], *(f"{v:x}" for v in key[1:])]
        if debug is not None:
            debug_key = _file_key(debug)
            if debug_key is None:
                return
            parts += [f"{v:x}" for v in debug_key[1:]]
        self.directory = os.path.join(user_cache_path(), "elf-symbols")
        self.path = os.path.join(self.directory, ".".join([*parts, f"v{self.FORMAT}"]))

    def load(self) -> SymbolTable | None:
        if self.path is None:
            return None
        import marshal

        try:
            with open(self.path, "rb") as f:
                form, start, size, index, names, kind, module, modules = marshal.loads(f.read())
            if form != self.FORMAT:
                return None
            return SymbolTable(np.frombuffer(start, np.uint64), np.frombuffer(size, np.uint64),
                               np.frombuffer(index, np.int32), names,
                               np.frombuffer(kind, np.uint8), np.frombuffer(module, np.int32),
                               modules)  # fmt: skip
        except (OSError, EOFError, ValueError, TypeError):
            return None

    def save(self, table: SymbolTable) -> None:
        if self.path is None:
            return
        import contextlib
        import marshal

        data = (self.FORMAT, table.start.tobytes(), table.size.tobytes(),
                table.name_index.astype(np.int32).tobytes(), list(table.names),
                table.kind.tobytes(), table.module.astype(np.int32).tobytes(),
                list(table.modules))  # fmt: skip
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(marshal.dumps(data))
            os.replace(tmp, self.path)
            kept = os.listdir(self.directory)
            if len(kept) > self.KEEP:
                by_age = sorted(
                    kept, key=lambda n: os.stat(os.path.join(self.directory, n)).st_mtime
                )
                for old in by_age[: len(kept) - self.KEEP]:
                    os.unlink(os.path.join(self.directory, old))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


# Where detached debug files are found by build id (``.build-id/xx/yyyy.debug``).
DEBUG_DIRS = ("/usr/lib/debug",)


def _detached_debug(build_id: bytes | None) -> str | None:
    if not build_id:
        return None
    hexid = build_id.hex()
    for d in DEBUG_DIRS:
        path = os.path.join(d, ".build-id", hexid[:2], hexid[2:] + ".debug")
        if os.path.isfile(path):
            return path
    return None


def load_elf(
    path: str | os.PathLike[str],
    load_address: int | None = None,
    asid: Asid = ANY,
    *,
    executable_only: bool = False,
    mapped: str | None = None,
) -> LoadedElf:
    """Make the sections and relocated symbols of an ELF file (named
    after ``mapped``, the path a recording mapped, when ``path`` is a copy
    of it).

    ``load_address`` is where the lowest ``PT_LOAD`` address goes (bias =
    load_address - lowest vaddr), for any ELF type as in ptxed; None keeps
    the link addresses (right for ET_EXEC, and for ET_DYN linked at 0 it
    means "loaded at 0").
    """
    elf = read_elf(path)
    name = os.path.basename(mapped or elf.path)
    loadable = [s for s in elf.segments if s.filesz > 0]
    if executable_only:
        loadable = [s for s in loadable if s.executable]
    if not loadable:
        what = "executable load segments" if executable_only else "load segments with file bytes"
        raise ImageError(f"{elf.path}: no {what}")
    bias = 0 if load_address is None else load_address - elf.min_vaddr
    sections = tuple(
        Section.from_file(elf.path, s.offset, s.filesz, s.vaddr + bias, name, mapped)
        for s in loadable
    )
    symbols = elf.symbols.relocate(bias, name)
    return LoadedElf(elf.path, name, elf.elf_type, bias, asid, sections, symbols)


def c_strings(table: bytes, offsets: np.ndarray) -> list[str]:
    """The NUL-terminated strings at ``offsets`` of a string table (on to
    its end where no NUL follows; empty past it), as UTF-8 with bad bytes
    replaced.  A table of ASCII (nearly all are) is decoded once and cut."""
    if not offsets.shape[0]:
        return []
    arr = np.frombuffer(table, np.uint8)
    starts, ends = _string_bounds(arr, offsets)
    return _cut(table, _is_ascii(arr), starts, ends)


def _is_ascii(table: np.ndarray) -> bool:
    return not table.shape[0] or int(table.max()) < 0x80


def _string_bounds(table: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the NUL-terminated strings at ``offsets`` of a string table
    (bytes) start and end, as :func:`c_strings` cuts them."""
    n = table.shape[0]
    nul = np.flatnonzero(table == 0)
    starts = np.minimum(offsets.astype(np.int64), n)
    return starts, np.append(nul, n)[np.searchsorted(nul, starts)]


def _cut(table: bytes, ascii: bool, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    """The strings ``table[starts:ends]``, as :func:`c_strings` decodes them
    (``ascii``: the table's bytes all are)."""
    pairs = zip(starts.tolist(), ends.tolist(), strict=True)
    if ascii:
        text = table.decode("ascii")
        return [text[a:b] for a, b in pairs]
    return [table[a:b].decode("utf-8", "replace") for a, b in pairs]


def _leading_underscores(table: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many ``_`` each string ``table[starts:ends]`` starts with (a
    pass per underscore: names have a few at most)."""
    count = np.zeros(starts.shape[0], np.int64)
    live = np.flatnonzero(starts < ends)
    while live.shape[0]:
        live = live[table[starts[live] + count[live]] == 0x5F]
        count[live] += 1
        live = live[starts[live] + count[live] < ends[live]]
    return count


def _read_symbols(
    path: str,
    buf: np.ndarray,
    tables: list[tuple[str, int, int, int, int, int]],
    elfclass: int,
    little: bool,
) -> SymbolTable:
    """Functions and objects with a size from ``.symtab`` and ``.dynsym``, aliases merged.

    Of symbols with the same start and size one name is kept: a function's
    over an object's, then global over weak over local, then the one with
    fewer leading underscores, then the shorter (``memcpy`` over
    ``__memcpy_avx_unaligned``-style internal aliases).
    """
    dtype = np.dtype(_SYM_FIELDS[elfclass]).newbyteorder("<" if little else ">")
    total = buf.shape[0]
    value_parts, size_parts, kind_parts, bind_parts = [], [], [], []
    # Per table: its strings, and where its symbols' names are in them.
    # The names that sort symbols are measured in place; only the names
    # kept are made into strings (about two thirds of them).
    strings: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []
    for section, offset, size, entsize, str_offset, str_size in tables:
        if entsize != dtype.itemsize or size % entsize:
            raise ImageError(f"{path}: malformed symbol table {section} (entry size {entsize})")
        if offset + size > total or str_offset + str_size > total:
            raise ImageError(
                f"{path}: truncated ELF file: symbol table {section} at offset {offset:#x} "
                f"extends beyond the end of the file ({total:#x})"
            )
        entries = buf[offset : offset + size].view(dtype)
        kind = entries["info"] & 0xF
        shndx = entries["shndx"]
        keep = (
            ((kind == STT_FUNC) | (kind == STT_GNU_IFUNC) | (kind == STT_OBJECT))
            & (entries["size"] > 0)
            & (shndx != SHN_UNDEF)
            & ((shndx < SHN_LORESERVE) | (shndx == SHN_XINDEX))
        )
        entries = entries[keep]
        table = buf[str_offset : str_offset + str_size]
        strings.append((table, *_string_bounds(table, entries["name"]), _is_ascii(table)))
        value_parts.append(entries["value"].astype(np.uint64))
        size_parts.append(entries["size"].astype(np.uint64))
        kind_parts.append(
            np.select([kind[keep] == STT_OBJECT, kind[keep] == STT_GNU_IFUNC], [OBJECT, IFUNC],
                      FUNCTION)
        )  # fmt: skip
        bind_parts.append(entries["info"] >> 4)
    if not sum(t[1].shape[0] for t in strings):
        return SymbolTable.empty()

    value = np.concatenate(value_parts)
    size = np.concatenate(size_parts)
    kind = np.concatenate(kind_parts).astype(np.uint8)
    bind = np.concatenate(bind_parts)
    bind_rank = np.select([bind == STB_GLOBAL, bind == STB_WEAK, bind == STB_LOCAL], [0, 1, 2], 3)
    underscores = np.concatenate([_leading_underscores(*t[:3]) for t in strings])
    length = np.concatenate([_name_lengths(*t) for t in strings])
    sequence = np.arange(length.shape[0])
    order = np.lexsort(
        (sequence, length, underscores, bind_rank, -kind.astype(np.int8), size, value)
    )
    value, size = value[order], size[order]
    first = np.ones(len(order), bool)
    first[1:] = (value[1:] != value[:-1]) | (size[1:] != size[:-1])
    chosen = order[first]
    return SymbolTable(
        value[first],
        size[first],
        np.arange(len(chosen), dtype=np.int32),
        _names_of(strings, chosen),
        kind[chosen],
    )


def _name_lengths(table: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  ascii: bool) -> np.ndarray:  # fmt: skip
    """The lengths in characters of the strings ``table[starts:ends]`` as
    decoded (bytes, for a table of ASCII)."""
    if ascii:
        return ends - starts
    return np.array([len(n) for n in _cut(table.tobytes(), False, starts, ends)], np.int64)


def _names_of(strings: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]],
              rows: np.ndarray) -> list[str]:  # fmt: skip
    """The names of symbols ``rows`` (numbered across the tables of
    ``strings`` in turn), decoded."""
    names: list[str] = [""] * rows.shape[0]
    first = 0
    for table, starts, ends, ascii in strings:
        last = first + starts.shape[0]
        at = np.flatnonzero((rows >= first) & (rows < last))
        local = rows[at] - first
        cut = _cut(table.tobytes(), ascii, starts[local], ends[local])
        for j, name in zip(at.tolist(), cut, strict=True):
            names[j] = name
        first = last
    return names
