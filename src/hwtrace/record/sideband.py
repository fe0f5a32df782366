"""What a recording of a process writes beside its trace, whatever the
backend: its mappings as PERF_RECORD_MMAP2 bodies, the files that hold its
code, the TSC's conversion to perf time and perf's address filters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..image import Image, ImageError, read_elf
from ..image.process import Mapping, load_bias
from ..perf.sideband import TscConversion, elf_build_id
from .errors import RecordError

__all__ = [
    "MmapRecord",
    "TimeConversion",
    "files_image",
    "mmap_records",
    "perf_filters",
    "tsc_conversion",
]


@dataclass(frozen=True)
class TimeConversion(TscConversion):
    """The stepping clock to perf time, as ``perf_event_mmap_page`` converts
    TSC (:class:`~hwtrace.perf.sideband.TscConversion`); ``tsc_hz`` is the
    stepping clock's rate."""

    tsc_hz: float = 1e9


@dataclass(frozen=True)
class MmapRecord:
    """A file or anonymous mapping of the traced process (a PERF_RECORD_MMAP2)."""

    start: int
    length: int
    pgoff: int  # file offset in bytes
    path: str
    prot: str  # "r-xp"
    inode: int
    build_id: bytes | None  # the ELF's GNU build id, when it has one


def files_image(comm: str, mmaps: list[MmapRecord], maps: list[Mapping],
                 vdso: Path | None) -> Image:  # fmt: skip
    """The ELF files mapped executable (``mmaps``), at their load addresses
    (from ``maps``), and the vDSO's file."""
    image = Image(comm)
    seen = set()
    for m in mmaps:
        if "x" not in m.prot or not m.path.startswith("/") or m.path in seen:
            continue
        seen.add(m.path)
        try:
            elf = read_elf(m.path)
        except ImageError:
            continue
        bias = load_bias(maps, m.path, elf.min_vaddr)
        if bias is not None:
            image.add_elf(m.path, elf.min_vaddr + bias)
    for m in mmaps:
        if m.path == "[vdso]" and vdso is not None:
            image.add_elf(vdso, m.start)
    return image


def mmap_records(
    maps: list[Mapping], build_ids: dict[str, bytes | None], vdso: bytes = b""
) -> list[MmapRecord]:
    for path in {m.path for m in maps if m.path.startswith("/") and m.inode}:
        if path not in build_ids:
            build_ids[path] = elf_build_id(path)  # once per file
    if vdso and "[vdso]" not in build_ids:
        build_ids["[vdso]"] = elf_build_id(vdso)
    return [
        MmapRecord(m.start, m.length, m.offset, m.path, m.prot, m.inode, build_ids.get(m.path))
        for m in maps
    ]


def tsc_conversion(first: tuple[int, int], last: tuple[int, int]) -> TimeConversion:
    """TSC to CLOCK_MONOTONIC ns through two ``(tsc, ns)`` pairs read
    together, as perf's ``time_shift``/``time_mult``/``time_zero``."""
    (c0, n0), (c1, n1) = first, last
    if c1 <= c0 or n1 <= n0:
        raise RecordError("the TSC did not advance: cannot convert stepping times to ns")
    rate = (n1 - n0) / (c1 - c0)  # ns per tick
    shift = 31
    while rate * (1 << shift) >= 1 << 32:
        shift -= 1
    mult = round(rate * (1 << shift))
    zero = n0 - ((c0 >> shift) * mult + (((c0 & ((1 << shift) - 1)) * mult) >> shift))
    return TimeConversion(shift, mult, zero % (1 << 64), 1e9 / rate)


def perf_filters(ranges: Sequence[tuple[int, int]], maps: list[Mapping]) -> str:
    """Address ranges as perf address filters (``filter START/SIZE@FILE``)."""
    parts = []
    for lo, hi in ranges:
        m = next((m for m in maps if m.start <= lo < m.end and m.path.startswith("/")), None)
        if m is None:
            parts.append(f"filter {lo:#x}/{hi - lo:#x}")
        else:
            off = lo - m.start + m.offset
            parts.append(f"filter {off:#x}/{hi - lo:#x}@{m.path}")
    return " , ".join(parts)
