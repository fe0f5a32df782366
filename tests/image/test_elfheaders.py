"""The numpy ELF header reader (hwtrace.image.elfheaders) against
pyelftools on the system's own binaries, and on damaged copies of them:
a damaged file is an ImageError naming it, never another exception."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import example, given, settings
from hypothesis import strategies as st
from realdata import system_binaries

from hwtrace.image import ImageError, read_elf
from hwtrace.image.elfheaders import ElfHeaders
from hwtrace.image.plt import plt_symbols

BINARIES = system_binaries(
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    "/usr/lib/x86_64-linux-gnu/libm.so.6",
    "/bin/true",
    "/usr/bin/python3",
)


@pytest.mark.parametrize("path", BINARIES, ids=os.path.basename)
def test_headers_equal_pyelftools(path):
    head = ElfHeaders(path)
    with open(path, "rb") as f:
        elf = ELFFile(f)
        assert head.elf_type == elf["e_type"]
        assert head.machine == elf["e_machine"]
        assert head.elfclass == elf.elfclass and head.little == elf.little_endian
        sections = list(elf.iter_sections())
        assert head.section_names == [s.name for s in sections]
        for row, s in zip(head.section_headers, sections, strict=True):
            for field in ("sh_flags", "sh_addr", "sh_offset", "sh_size", "sh_link", "sh_entsize"):
                assert int(row[field]) == s[field], (s.name, field)
        segments = list(elf.iter_segments())
        assert len(head.program_headers) == len(segments)
        for row, seg in zip(head.program_headers, segments, strict=True):
            for field in ("p_offset", "p_vaddr", "p_filesz", "p_memsz", "p_flags"):
                assert int(row[field]) == seg[field]
        ids = [n["n_desc"] for s in sections if s["sh_type"] == "SHT_NOTE"
               for n in s.iter_notes() if n["n_type"] == "NT_GNU_BUILD_ID"]  # fmt: skip
    assert (head.build_id() or b"").hex() == (ids[0] if ids else "")


def _plt_by_pyelftools(path: str) -> dict[int, str]:
    """GOT slot -> bound name, read with pyelftools' relocation sections."""
    from elftools.elf.relocation import RelocationSection

    out: dict[int, str] = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for name in (".rela.plt", ".rela.dyn"):
            sec = elf.get_section_by_name(name)
            if not isinstance(sec, RelocationSection):
                continue
            symtab = elf.get_section(sec["sh_link"])
            for rel in sec.iter_relocations():
                if rel["r_info_type"] == 7:  # R_X86_64_JUMP_SLOT
                    out[rel["r_offset"]] = symtab.get_symbol(rel["r_info_sym"]).name.split("@")[0]
    return out


@pytest.mark.parametrize("path", BINARIES, ids=os.path.basename)
def test_plt_names_are_the_relocations_pyelftools_reads(path):
    from hwtrace.image.plt import _slot_names

    head = ElfHeaders(path)
    if head.machine != "EM_X86_64" or head.section_index(".dynsym") < 0:
        pytest.skip("no dynamic symbols")
    by_slot, _ = _slot_names(head)
    expected = _plt_by_pyelftools(path)
    assert expected, "a dynamically linked program calls something through its PLT"
    assert {k: by_slot.get(k) for k in expected} == expected
    names = {name for _, _, name in plt_symbols(head)}
    assert names, "PLT entries are named"
    assert names <= {f"{n}@plt" for n in by_slot.values()}


SEED = BINARIES[-1] if BINARIES else None


@pytest.mark.skipif(SEED is None, reason="no system binary to damage")
@settings(max_examples=300, deadline=None)
@given(
    cut=st.integers(0, 1 << 16),
    flips=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=12),
)
# (section headers moved so that the section names' own section is cut off)
@example(cut=17345, flips=[(40, 1)])
def test_a_damaged_elf_file_is_an_image_error(tmp_path_factory, cut, flips):
    data = bytearray(open(SEED, "rb").read(1 << 17))
    for at, value in flips:
        data[at % len(data)] = value
    # The tables of a large binary sit near its end: keep the header, cut
    # the rest short (or not at all), so that offsets point past the end.
    data = data[: max(cut, 64)] if cut < len(data) else data
    path = tmp_path_factory.mktemp("elf") / "damaged"
    path.write_bytes(bytes(data))
    try:
        head = ElfHeaders(path)
        head.notes()
        head.build_id()
        for i in range(head.section_headers.shape[0]):
            head.section_bytes(i)
        elf = read_elf(path)
    except ImageError as e:
        assert "damaged" in str(e)
        return
    assert elf.path == str(path)
    assert isinstance(elf.symbols.start, np.ndarray)


@pytest.mark.skipif(SEED is None, reason="no system binary to read")
def test_a_renamed_file_is_read_under_its_new_name(tmp_path):
    """read_elf keeps what it read per file; a file renamed since (same
    inode, size and time) is the file at its new path."""
    first = tmp_path / "staged"
    first.write_bytes(Path(SEED).read_bytes())
    assert read_elf(first).path == str(first)
    moved = tmp_path / "final"
    first.rename(moved)
    elf = read_elf(moved)
    assert elf.path == str(moved)
    assert len(elf.symbols) == len(read_elf(SEED).symbols)
