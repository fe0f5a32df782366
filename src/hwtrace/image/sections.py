"""Sections, address-space identifiers and the ptxed-style load specs.

A :class:`Section` is what libipt calls a section: a contiguous run of bytes
that appears at one virtual address.  File-backed sections share one
read-only memory map per file, so loading a large binary costs address space,
not memory, and splitting a section (when a newer one overlaps it) is a slice.

An :class:`Asid` says in which address space a section lives, keyed the way
Intel PT keys it: by CR3 (from PIP packets) and by VMCS base (from VMCS
packets).  An unset field is a wildcard, as in libipt's ``pt_asid``.
"""

from __future__ import annotations

import mmap
import os
import re
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = [
    "ANY",
    "Asid",
    "ImageError",
    "RawSpec",
    "Section",
    "map_file",
    "parse_c_uint",
    "parse_elf_spec",
    "parse_raw_spec",
]

ADDRESS_LIMIT = 1 << 64


class ImageError(Exception):
    """A file or spec cannot be used for a memory image.

    The message names the file (and the offset where one matters) and says
    what is wrong, so a command can print it as is.
    """


@dataclass(frozen=True, slots=True)
class Asid:
    """An address-space identifier: CR3 and VMCS base; ``None`` matches any value.

    Sections added with ``Asid()`` are visible in every address space; a
    query with ``Asid()`` sees the sections of every address space.
    """

    cr3: int | None = None
    vmcs: int | None = None

    def matches(self, other: Asid) -> bool:
        """True when the two could name the same address space (libipt's pt_asid_match)."""
        if self.cr3 is not None and other.cr3 is not None and self.cr3 != other.cr3:
            return False
        return self.vmcs is None or other.vmcs is None or self.vmcs == other.vmcs

    def __str__(self) -> str:
        cr3 = "*" if self.cr3 is None else f"{self.cr3:#x}"
        vmcs = "*" if self.vmcs is None else f"{self.vmcs:#x}"
        return f"cr3={cr3}, vmcs={vmcs}"


ANY = Asid()

# One read-only map per file, shared by every section cut from it and
# released when the last of them goes away.
_MAPS: weakref.WeakValueDictionary[tuple[int, int, int, int], np.ndarray] = (
    weakref.WeakValueDictionary()
)


def map_file(path: str | os.PathLike[str]) -> np.ndarray:
    """Memory-map a whole file read-only as a uint8 array.

    Raises :class:`ImageError` naming the file when it cannot be opened or is
    empty.  Maps are shared while any section uses them.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            st = os.fstat(f.fileno())
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            cached = _MAPS.get(key)
            if cached is not None:
                return cached
            if st.st_size == 0:
                raise ImageError(f"{name}: the file is empty")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise ImageError(f"{name}: cannot open: {exc.strerror or exc}") from exc
    except ValueError as exc:  # mmap of something that is not a regular file
        raise ImageError(f"{name}: cannot map: {exc}") from exc
    array = np.frombuffer(mm, dtype=np.uint8)
    _MAPS[key] = array
    return array


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class Section:
    """A contiguous run of bytes loaded at a virtual address.

    ``data`` is a read-only uint8 view (of the file's memory map for
    file-backed sections), ``offset`` is where ``data`` starts in
    ``filename`` (0 for in-memory sections) and ``name`` is for people.
    ``mapped``: the path a recording mapped the code from when
    ``filename`` is a copy of that file found elsewhere (in perf's
    build-id cache, under a ``--symfs`` root); :attr:`path` is the one to
    name the code by.
    """

    address: int
    size: int
    data: np.ndarray
    filename: str | None = None
    offset: int = 0
    name: str = ""
    mapped: str | None = None

    def __post_init__(self) -> None:
        if self.data.dtype != np.uint8 or self.data.ndim != 1:
            raise ValueError("section data must be a 1-d uint8 array")
        if self.size != self.data.shape[0] or self.size <= 0:
            raise ValueError(f"bad section size {self.size} for {self.data.shape[0]} bytes")
        if not 0 <= self.address <= ADDRESS_LIMIT - self.size:
            raise ValueError(f"section at {self.address:#x} does not fit in 64 bits")
        if self.data.flags.writeable:
            view = self.data.view()
            view.flags.writeable = False
            object.__setattr__(self, "data", view)

    @property
    def path(self) -> str | None:
        """The file the code is known by: the one the recording mapped,
        else the one its bytes are read from (None: in memory)."""
        return self.mapped or self.filename

    @property
    def end(self) -> int:
        """The first address after the section."""
        return self.address + self.size

    @classmethod
    def from_bytes(
        cls, data: bytes | bytearray | np.ndarray, address: int, name: str = ""
    ) -> Section:
        """An in-memory section (a copy of ``data``), e.g. for JIT code or tests."""
        if isinstance(data, np.ndarray):
            array = np.array(data, dtype=np.uint8).reshape(-1)
        else:
            array = np.frombuffer(bytes(data), dtype=np.uint8)
        if array.shape[0] == 0:
            raise ImageError(f"{name or 'section'} at {address:#x}: no bytes")
        _check_address(name or "section", address, array.shape[0])
        return cls(address, array.shape[0], array, None, 0, name)

    @classmethod
    def from_file(
        cls,
        filename: str | os.PathLike[str],
        offset: int = 0,
        size: int | None = None,
        address: int = 0,
        name: str | None = None,
        mapped: str | None = None,
    ) -> Section:
        """Bytes ``offset .. offset+size`` of a file (to its end when size is None),
        memory-mapped, at ``address`` (``mapped``: see :class:`Section`)."""
        path = os.fspath(filename)
        if offset < 0 or (size is not None and size <= 0):
            raise ImageError(f"{path}: bad range: offset {offset:#x}, size {size}")
        whole = map_file(path)
        total = whole.shape[0]
        if offset >= total:
            raise ImageError(
                f"{path}: offset {offset:#x} is beyond the end of the file ({total:#x})"
            )
        end = total if size is None else offset + size
        if end > total:
            raise ImageError(
                f"{path}: range {offset:#x}-{end:#x} extends beyond the end of the file ({total:#x})"
            )
        _check_address(path, address, end - offset)
        label = os.path.basename(mapped or path) if name is None else name
        return cls(address, end - offset, whole[offset:end], path, offset, label,
                   None if mapped == path else mapped)  # fmt: skip

    def slice(self, begin: int, end: int) -> Section:
        """The part of the section at addresses ``begin .. end`` (same map, no copy)."""
        lo, hi = begin - self.address, end - self.address
        if not 0 <= lo < hi <= self.size:
            raise ValueError(f"{begin:#x}-{end:#x} is not inside {self!r}")
        return Section(begin, hi - lo, self.data[lo:hi], self.filename, self.offset + lo, self.name,
                       self.mapped)  # fmt: skip

    def __repr__(self) -> str:
        where = f"{self.filename}@{self.offset:#x}" if self.filename else "memory"
        return f"Section({self.name!r}, {self.address:#x}-{self.end:#x}, {where})"


def _check_address(what: str, address: int, size: int) -> None:
    if not 0 <= address <= ADDRESS_LIMIT - size:
        raise ImageError(f"{what}: {size:#x} bytes at {address:#x} do not fit in 64 bits")


# C's strtoull(s, &end, 0) when it must consume all of s: 0x hex, leading-0
# octal, else decimal.  Signs and white space are not accepted.
_C_UINT = re.compile(r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*")


def parse_c_uint(text: str) -> int | None:
    """Parse a whole C base-0 unsigned literal ("0x10", "010", "16"); None if it is not one
    or does not fit in 64 bits."""
    if not _C_UINT.fullmatch(text):
        return None
    if text[:2] in ("0x", "0X"):
        value = int(text[2:], 16)
    elif text.startswith("0"):
        value = int(text, 8)
    else:
        value = int(text, 10)
    return value if value < ADDRESS_LIMIT else None


class RawSpec(NamedTuple):
    """A parsed ``--raw`` argument; the fields are :meth:`Image.add_raw`'s arguments."""

    filename: str
    offset: int
    size: int | None
    address: int


def _split_range(arg: str, spec: str) -> tuple[str, int, int | None]:
    """``file[:from[-to]]`` as ptxed's preprocess_filename splits it.

    A suffix that is not a number or a range stays part of the file name
    (file names may contain ':'); a range whose end is not after its start
    is an error.
    """
    name, sep, text = arg.rpartition(":")
    if not sep or not text:
        return arg, 0, None
    lo_text, dash, hi_text = text.partition("-")
    lo = parse_c_uint(lo_text)
    if lo is None:
        return arg, 0, None
    if not dash:
        return name, lo, None
    hi = 0 if hi_text == "" else parse_c_uint(hi_text)  # strtoull("") is 0
    if hi is None:
        return arg, 0, None
    if hi <= lo:
        raise ImageError(f"{spec}: bad range {text}: the end must be after the start")
    return name, lo, hi - lo


def parse_raw_spec(spec: str) -> RawSpec:
    """Parse ptxed's ``--raw <file>[:<from>[-<to>]]:<base>``.

    The base is after the last ':'; ``from`` and ``to`` are file offsets
    (``to`` exclusive); numbers are C literals (0x hex, 0 octal, decimal).
    """
    head, sep, base_text = spec.rpartition(":")
    if not sep or not base_text:
        raise ImageError(f"{spec}: missing base address (expected <file>[:<from>[-<to>]]:<base>)")
    base = parse_c_uint(base_text)
    if base is None:
        raise ImageError(f"{spec}: bad base address {base_text!r}")
    filename, offset, size = _split_range(head, spec)
    if not filename:
        raise ImageError(f"{spec}: missing file name")
    return RawSpec(filename, offset, size, base)


def parse_elf_spec(spec: str) -> tuple[str, int | None]:
    """Parse ptxed's ``--elf <file>[:<base>]`` into (file, base).

    As in ptxed, a suffix that is no number is part of the file name, and a
    base of 0 means the link addresses (returned as None).
    """
    head, sep, base_text = spec.rpartition(":")
    base = parse_c_uint(base_text) if sep else None
    if base is None or not head:
        return spec, None
    return head, base or None
