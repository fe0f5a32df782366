"""Function bounds from ``.eh_frame_hdr`` (hwtrace.image.ehframe) against
pyelftools' reading of every FDE of the system's binaries, the
``sub_<address>`` symbols read_elf makes of them for stripped code, and
damaged tables (no functions, never an exception)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import given, settings
from hypothesis import strategies as st
from realdata import is_elf, system_binaries

from hwtrace.image import Image, read_elf
from hwtrace.image.ehframe import eh_frame_functions
from hwtrace.image.elfheaders import ElfHeaders

BINARIES = system_binaries(
    "/usr/bin/gzip",  # stripped: only .dynsym
    "/bin/ls",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libm.so.6",
    "/usr/bin/python3",
)
GZIP = os.path.realpath("/usr/bin/gzip")


def _fdes(path: str) -> list[tuple[int, int]]:
    """pyelftools: (initial_location, address_range) of every FDE with a
    range, sorted."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        if not elf.has_dwarf_info() and elf.get_section_by_name(".eh_frame") is None:
            return []
        entries = elf.get_dwarf_info().EH_CFI_entries()
        return sorted(
            (e.header["initial_location"], e.header["address_range"])
            for e in entries
            if type(e).__name__ == "FDE" and e.header["address_range"] > 0
        )


@pytest.mark.skipif(not BINARIES, reason="no system binary to read")
@pytest.mark.parametrize("path", BINARIES)
def test_functions_are_the_fdes_pyelftools_reads(path):
    start, size = eh_frame_functions(ElfHeaders(path))
    assert start.dtype == np.uint64 and size.dtype == np.uint64
    assert list(zip(start.tolist(), size.tolist(), strict=True)) == _fdes(path)


@pytest.mark.skipif(not is_elf(GZIP), reason="/usr/bin/gzip is not installed")
def test_a_stripped_program_has_its_functions_named():
    """gzip (Debian strips it) has no symbol for its own functions: each
    FDE no symbol covers is a ``sub_<link address>`` of the FDE's range,
    and none of them hides a symbol."""
    symbols = read_elf(GZIP).symbols
    fdes = dict(_fdes(GZIP))
    made = [i for i in range(len(symbols)) if symbols.name(i).startswith("sub_")]
    assert len(made) > 50
    others = symbols.subset(~np.isin(np.arange(len(symbols)), made)).functions
    for i in made:
        start, size = int(symbols.start[i]), int(symbols.size[i])
        assert symbols.name(i) == f"sub_{start:x}"
        assert fdes[start] == size
        assert others.index_of([start])[0] < 0
        inside = (others.start >= start) & (others.start < start + size)
        assert not inside.any()
    # Loaded at a base, an address in one resolves to it, with the module.
    image = Image()
    base = 0x5555_0000_0000
    image.add_elf(GZIP, load_address=base)  # gzip is PIE: linked at 0
    start = int(symbols.start[made[0]])
    assert image.symbolize(base + start + 1, with_module=True) == f"gzip!sub_{start:x}+0x1"


@pytest.mark.skipif(not BINARIES, reason="no system binary to read")
def test_symbols_keep_their_names_where_the_file_has_them():
    """A library with full symbols gets at most a few ``sub_`` names (FDEs
    of code no sized symbol covers), never one over a named function."""
    libc = next((p for p in BINARIES if os.path.basename(p) == "libc.so.6"), BINARIES[0])
    symbols = read_elf(libc).symbols
    made = [i for i in range(len(symbols)) if symbols.name(i) == f"sub_{int(symbols.start[i]):x}"]
    assert len(made) < 0.05 * len(symbols)


def _section_range(path: str, *names: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        found = [elf.get_section_by_name(n) for n in names]
        found = [s for s in found if s is not None]
        lo = min(s["sh_offset"] for s in found)
        hi = max(s["sh_offset"] + s["sh_size"] for s in found)
    return lo, hi


SEED = GZIP if is_elf(GZIP) else (BINARIES[0] if BINARIES else None)


@pytest.mark.skipif(SEED is None, reason="no system binary to damage")
@settings(max_examples=300, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1,
                      max_size=16))  # fmt: skip
def test_a_damaged_table_gives_no_error(flips):
    """Bytes of .eh_frame_hdr and .eh_frame changed at random: functions
    or none, never an exception; what is given lies in the file's code."""
    data = np.frombuffer(open(SEED, "rb").read(), np.uint8).copy()
    lo, hi = _section_range(SEED, ".eh_frame_hdr", ".eh_frame")
    for at, value in flips:
        data[lo + at % (hi - lo)] = value
    start, size = eh_frame_functions(ElfHeaders(SEED, buf=data))
    assert start.shape == size.shape
    assert (size > 0).all()


@pytest.mark.skipif(SEED is None, reason="no system binary to read")
def test_a_cut_table_gives_no_functions():
    data = np.frombuffer(open(SEED, "rb").read(), np.uint8)
    lo, _ = _section_range(SEED, ".eh_frame_hdr")
    # The FDE count made larger than the file: nothing is read.
    damaged = data.copy()
    damaged[lo + 8 : lo + 12] = np.frombuffer((1 << 30).to_bytes(4, "little"), np.uint8)
    start, _ = eh_frame_functions(ElfHeaders(SEED, buf=damaged))
    assert start.shape[0] == 0
    # No search table (DW_EH_PE_omit): none either.
    damaged = data.copy()
    damaged[lo + 3] = 0xFF
    assert eh_frame_functions(ElfHeaders(SEED, buf=damaged))[0].shape[0] == 0
