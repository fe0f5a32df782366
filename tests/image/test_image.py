"""Memory images: ELF and raw loading, overlaps, address spaces, symbols, errors.

The ELF tests build a small executable and a shared object with gcc and check
what the image reads back against pyelftools (and objdump where installed).
"""

import re
import shutil
import subprocess

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.image import (
    ANY,
    FUNCTION,
    OBJECT,
    Asid,
    Image,
    ImageError,
    RawSpec,
    Section,
    SymbolTable,
    parse_c_uint,
    parse_elf_spec,
    parse_raw_spec,
    read_elf,
)

GCC = shutil.which("gcc")
OBJDUMP = shutil.which("objdump")
needs_gcc = pytest.mark.skipif(
    GCC is None, reason="gcc is not installed: these tests build their ELF inputs with it"
)

SOURCE = r"""
int counter;
int table[64] = {1, 2, 3};

__attribute__((noinline)) int work(int x)
{
    for (int i = 0; i < x; i++)
        counter += i * 3 + table[i & 63];
    return counter;
}

int alias_work(int) __attribute__((alias("work")));

static __attribute__((noinline)) int helper(int x)
{
    return x * 7 + counter;
}

int main(int argc, char **argv)
{
    (void) argv;
    return work(argc) + helper(argc);
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An ET_EXEC (-no-pie) and an ET_DYN (-shared -fPIC) built from SOURCE."""
    if GCC is None:
        pytest.skip("gcc is not installed: these tests build their ELF inputs with it")
    root = tmp_path_factory.mktemp("elf")
    source = root / "prog.c"
    source.write_text(SOURCE)
    exe, lib = root / "prog", root / "libprog.so"
    subprocess.run([GCC, "-O1", "-no-pie", "-o", exe, source], check=True)
    subprocess.run([GCC, "-O1", "-shared", "-fPIC", "-o", lib, source], check=True)
    return {"exe": str(exe), "lib": str(lib)}


def elf_symbols(path):
    """{name: (value, size, type, bytes in the file)} for defined, sized .symtab symbols."""
    found = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        data = open(path, "rb").read()
        for sym in elf.get_section_by_name(".symtab").iter_symbols():
            kind = sym["st_info"]["type"]
            shndx = sym["st_shndx"]
            if kind not in ("STT_FUNC", "STT_OBJECT") or not sym["st_size"]:
                continue
            if not isinstance(shndx, int):
                continue
            sec = elf.get_section(shndx)
            raw = b""
            if sec["sh_type"] != "SHT_NOBITS":
                off = sec["sh_offset"] + sym["st_value"] - sec["sh_addr"]
                raw = data[off : off + sym["st_size"]]
            found[sym.name] = (sym["st_value"], sym["st_size"], kind, raw)
    return found


def load_segments(path):
    with open(path, "rb") as f:
        return [
            s.header
            for s in ELFFile(f).iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_filesz"] > 0
        ]


# -- ELF files -------------------------------------------------------------------


@needs_gcc
def test_executable_reads_back_function_bytes(built):
    image = Image()
    loaded = image.add_elf(built["exe"])
    assert loaded.elf_type == "ET_EXEC"
    assert loaded.bias == 0
    symbols = elf_symbols(built["exe"])
    functions = {n: s for n, s in symbols.items() if s[2] == "STT_FUNC"}
    assert {"work", "main", "helper"} <= set(functions)
    for name, (value, size, _, raw) in functions.items():
        assert image.read(value, size) == raw, name
        assert image.find(value) is not None


@needs_gcc
@pytest.mark.skipif(OBJDUMP is None, reason="objdump is not installed")
def test_executable_bytes_agree_with_objdump(built):
    image = Image()
    image.add_elf(built["exe"])
    listing = subprocess.run(
        [OBJDUMP, "-d", "-j", ".text", built["exe"]], check=True, capture_output=True, text=True
    ).stdout
    checked = 0
    for line in listing.splitlines():
        match = re.match(r"\s*([0-9a-f]+):\t((?:[0-9a-f]{2} )+)", line)
        if match:
            address = int(match.group(1), 16)
            raw = bytes.fromhex(match.group(2))
            assert image.read(address, len(raw)) == raw, hex(address)
            checked += 1
    assert checked > 20


@needs_gcc
def test_shared_object_is_relocated_to_its_load_address(built):
    base = 0x7F12_3456_0000
    image = Image()
    loaded = image.add_elf(built["lib"], load_address=base)
    segments = load_segments(built["lib"])
    assert loaded.elf_type == "ET_DYN"
    assert loaded.bias == base - min(s["p_vaddr"] for s in segments)
    for name, (value, size, kind, raw) in elf_symbols(built["lib"]).items():
        if kind == "STT_FUNC":
            assert image.read(value + loaded.bias, size) == raw, name
    work = elf_symbols(built["lib"])["work"][0] + loaded.bias
    assert image.symbolize(work) == "libprog.so!work"
    assert image.symbolize(work + 3) == "libprog.so!work+0x3"
    assert image.symbolize(work + 3, with_module=False) == "work+0x3"
    assert image.symbolize(0x10) == ""
    # Where no symbol is: the file and the offset in it (a segment's bytes
    # sit at p_offset in the file and p_vaddr + bias in memory).
    text = next(s for s in segments if s["p_flags"] & 1)
    address = text["p_vaddr"] + loaded.bias + 4
    assert image.locate(address) == f"libprog.so+{text['p_offset'] + 4:#x}"
    assert image.locate(0x10) == ""
    image.add_section(Section.from_bytes(b"\x90" * 16, 0x1000, name="[vdso]"))
    assert image.locate(0x1008) == "[vdso]+0x8"


@needs_gcc
def test_shared_object_without_load_address_keeps_link_addresses(built):
    image = Image()
    assert image.add_elf(built["lib"]).bias == 0
    value, size, _, raw = elf_symbols(built["lib"])["work"]
    assert image.read(value, size) == raw


@needs_gcc
def test_all_load_segments_with_file_bytes_are_mapped(built):
    image = Image()
    image.add_elf(built["exe"])
    expected = [(s["p_vaddr"], s["p_filesz"], s["p_offset"]) for s in load_segments(built["exe"])]
    assert [(s.address, s.size, s.offset) for s in image] == expected
    assert all(s.name == "prog" and s.filename == built["exe"] for s in image)

    only_code = Image()
    only_code.add_elf(built["exe"], executable_only=True)
    code = [s for s in load_segments(built["exe"]) if s["p_flags"] & 1]
    assert [(s.address, s.size) for s in only_code] == [(s["p_vaddr"], s["p_filesz"]) for s in code]


@needs_gcc
def test_sections_share_one_read_only_memory_map(built):
    image = Image()
    image.add_elf(built["exe"])
    sections = list(image)
    assert all(not s.data.flags.writeable for s in sections)
    assert len({id(s.data.base) for s in sections}) == 1
    with pytest.raises(ValueError):
        sections[0].data[0] = 1


@needs_gcc
def test_symbol_table_of_an_elf_file(built):
    symbols = elf_symbols(built["exe"])
    table = read_elf(built["exe"]).symbols
    by_name = {name: (start, size, is_function) for start, size, name, is_function in table}
    assert by_name["helper"][:2] == symbols["helper"][:2]  # a local from .symtab
    assert by_name["work"] == (symbols["work"][0], symbols["work"][1], True)
    assert by_name["counter"][2] is False and by_name["table"][1] == 256
    # work and alias_work are one function: one entry, under the shorter name
    assert "alias_work" not in by_name
    assert sum(1 for start, *_ in table if start == symbols["work"][0]) == 1
    assert {name for *_, name, _ in table.functions} <= {
        n for n, s in symbols.items() if s[2] == "STT_FUNC"
    }
    assert all(table.functions.kind == FUNCTION)
    assert OBJECT in set(table.kind.tolist())

    work, size = symbols["work"][:2]
    index, offset = table.lookup(np.array([work, work + 5, work + size, 0], np.uint64))
    assert [table.name(i) for i in index[:2]] == ["work", "work"]
    assert offset[:2].tolist() == [0, 5]
    assert index[3] == -1 and offset[3] == 0
    assert index[2] == -1 or table.name(index[2]) != "work"


@needs_gcc
def test_image_symbols_are_merged_across_files(built):
    image = Image()
    image.add_elf(built["exe"])
    image.add_elf(built["lib"], load_address=0x7F00_0000_0000)
    merged = image.symbols
    assert set(merged.modules) == {"prog", "libprog.so"}
    lib_work = elf_symbols(built["lib"])["work"][0] + 0x7F00_0000_0000
    exe_work = elf_symbols(built["exe"])["work"][0]
    index, offset = merged.lookup([exe_work + 1, lib_work + 2])
    assert [merged.qualified_name(i) for i in index] == ["prog!work", "libprog.so!work"]
    assert offset.tolist() == [1, 2]
    assert merged.symbolize(lib_work + 2, with_module=True) == "libprog.so!work+0x2"

    assert image.remove(built["lib"]) == len(load_segments(built["lib"]))
    assert set(image.symbols.modules) == {"prog"}


# -- ELF errors ------------------------------------------------------------------


def test_missing_file_is_an_image_error(tmp_path):
    path = tmp_path / "no-such-file"
    for load in (lambda: Image().add_elf(path), lambda: Image().add_raw(path, 0, None, 0x1000)):
        with pytest.raises(ImageError, match=r"no-such-file: cannot open: No such file"):
            load()


def test_file_that_is_not_elf_is_an_image_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some text, long enough to look like a header......\n" * 4)
    with pytest.raises(ImageError, match=r"notes\.txt: not an ELF file"):
        Image().add_elf(path)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match=r"empty\.bin: the file is empty"):
        Image().add_elf(empty)


@needs_gcc
@pytest.mark.parametrize("keep", [6, 40, 64, 200, 0x900, 0x1500, -64])
def test_truncated_elf_is_an_image_error(built, tmp_path, keep):
    data = open(built["exe"], "rb").read()
    path = tmp_path / "cut.elf"
    path.write_bytes(data[:keep])
    with pytest.raises(ImageError, match=r"cut\.elf: truncated") as info:
        Image().add_elf(path)
    assert str(path) in str(info.value)


@needs_gcc
def test_segment_beyond_the_end_is_named(built, tmp_path):
    # Keep the headers but drop the tail: the section headers go, then a segment.
    data = bytearray(open(built["exe"], "rb").read())
    wide = data[4] == 2
    shoff_at = 40 if wide else 32
    data[shoff_at : shoff_at + 8] = bytes(8)  # no section headers
    last = max(load_segments(built["exe"]), key=lambda s: s["p_offset"] + s["p_filesz"])
    path = tmp_path / "short.elf"
    path.write_bytes(bytes(data[: last["p_offset"] + 1]))
    with pytest.raises(ImageError, match=r"short\.elf: truncated ELF file: segment \d+ at offset"):
        Image().add_elf(path)


# -- raw files and specs ---------------------------------------------------------


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("code.bin:0x100000", RawSpec("code.bin", 0, None, 0x100000)),
        ("code.bin:4096", RawSpec("code.bin", 0, None, 4096)),
        ("code.bin:0100", RawSpec("code.bin", 0, None, 0o100)),
        ("code.bin:0", RawSpec("code.bin", 0, None, 0)),
        ("code.bin:0x10:0x1000", RawSpec("code.bin", 0x10, None, 0x1000)),
        ("code.bin:010-020:0x1000", RawSpec("code.bin", 8, 8, 0x1000)),
        ("code.bin:16-0x20:1000", RawSpec("code.bin", 16, 16, 1000)),
        ("code.bin:0X10-0X11:0XFFFFFFFFFFFFFFFF", RawSpec("code.bin", 16, 1, (1 << 64) - 1)),
        # a suffix that is not a range belongs to the file name, as in ptxed
        ("c:/dir/code.bin:0x1000", RawSpec("c:/dir/code.bin", 0, None, 0x1000)),
        ("a:b:0x1000", RawSpec("a:b", 0, None, 0x1000)),
        ("a:08:0x1000", RawSpec("a:08", 0, None, 0x1000)),
        ("a:0x10-zz:0x1000", RawSpec("a:0x10-zz", 0, None, 0x1000)),
        ("file::0x1000", RawSpec("file:", 0, None, 0x1000)),
    ],
)
def test_parse_raw_spec(spec, expected):
    assert parse_raw_spec(spec) == expected


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("code.bin", "missing base address"),
        ("code.bin:", "missing base address"),
        ("code.bin:08", "bad base address"),
        ("code.bin:0x", "bad base address"),
        ("code.bin:-1", "bad base address"),
        ("code.bin: 12", "bad base address"),
        ("code.bin:0x10000000000000000", "bad base address"),
        ("code.bin:0x20-0x10:0x1000", "bad range 0x20-0x10"),
        ("code.bin:0x20-0x20:0x1000", "bad range"),
        ("code.bin:5-:0x1000", "bad range"),
        (":0x1000", "missing file name"),
    ],
)
def test_malformed_raw_spec_is_an_image_error(spec, problem):
    with pytest.raises(ImageError, match=re.escape(problem)) as info:
        parse_raw_spec(spec)
    assert str(info.value).startswith(spec)


def test_parse_c_uint_follows_strtoull_base_0():
    assert parse_c_uint("0x1f") == 31
    assert parse_c_uint("017") == 15
    assert parse_c_uint("0") == 0
    assert parse_c_uint("19") == 19
    for bad in ("", "0x", "09", "1f", "+1", "-1", " 1", "1 ", str(1 << 64)):
        assert parse_c_uint(bad) is None, bad


def test_parse_elf_spec():
    assert parse_elf_spec("a.out") == ("a.out", None)
    assert parse_elf_spec("libc.so.6:0x7f0000000000") == ("libc.so.6", 0x7F0000000000)
    assert parse_elf_spec("libc.so.6:0") == ("libc.so.6", None)  # ptxed: 0 is the default
    assert parse_elf_spec("c:dir") == ("c:dir", None)


def test_raw_file_ranges(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)))
    image = Image()
    image.add_raw_spec(f"{path}:0x10-0x20:0x1000")
    image.add_raw(path, 0xF0, None, 0x2000)
    assert image.read(0x1000, 100) == bytes(range(0x10, 0x20))
    assert image.read(0x100F, 4) == b"\x1f"
    assert image.read(0x1010, 4) == b""
    assert image.read(0x2000, 100) == bytes(range(0xF0, 0x100))
    section = image.find(0x1004)
    assert (section.address, section.size, section.offset, section.name) == (
        0x1000,
        0x10,
        0x10,
        "blob.bin",
    )
    assert section.filename == str(path)


@pytest.mark.parametrize(
    "offset, size, problem",
    [
        (256, None, r"offset 0x100 is beyond the end of the file \(0x100\)"),
        (0x1000, 4, r"offset 0x1000 is beyond the end"),
        (0xF0, 0x20, r"range 0xf0-0x110 extends beyond the end of the file \(0x100\)"),
    ],
)
def test_raw_range_beyond_the_file_is_an_image_error(tmp_path, offset, size, problem):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(256))
    with pytest.raises(ImageError, match=r"blob\.bin: " + problem):
        Image().add_raw(path, offset, size, 0x1000)


# -- overlaps and address spaces -------------------------------------------------


def mem(address, fill, size):
    return Section.from_bytes(bytes([fill]) * size, address, name=f"fill{fill:#x}")


def layout(image, asid=ANY):
    return [(s.address, s.end, s.name) for s in image if image.find(s.address, asid) is s]


def test_newer_section_splits_an_older_one():
    image = Image()
    image.add_section(mem(0x1000, 0xAA, 0x100))
    image.add_section(mem(0x1040, 0xBB, 0x10))
    assert layout(image) == [
        (0x1000, 0x1040, "fill0xaa"),
        (0x1040, 0x1050, "fill0xbb"),
        (0x1050, 0x1100, "fill0xaa"),
    ]
    assert image.read(0x1030, 0x40) == b"\xaa" * 0x10  # stops at the section end
    assert image.read(0x1048, 0x40) == b"\xbb" * 8
    right = image.find(0x1050)
    assert right.data.tobytes() == b"\xaa" * 0xB0 and right.offset == 0x50


def test_newer_section_truncates_and_covers():
    image = Image()
    image.add_section(mem(0x1000, 1, 0x10))
    image.add_section(mem(0x1010, 2, 0x10))
    image.add_section(mem(0x1020, 3, 0x10))
    image.add_section(mem(0x1008, 4, 0x20))  # cuts the tail of 1, all of 2, the head of 3
    assert layout(image) == [
        (0x1000, 0x1008, "fill0x1"),
        (0x1008, 0x1028, "fill0x4"),
        (0x1028, 0x1030, "fill0x3"),
    ]
    assert len(image) == 3
    image.add_section(mem(0x0F00, 5, 0x200))
    assert layout(image) == [(0x0F00, 0x1100, "fill0x5")]


def test_reads_outside_any_section():
    image = Image()
    image.add_section(mem(0x1000, 1, 0x10))
    assert image.read(0xFFF, 4) == b""
    assert image.read(0x1010, 4) == b""
    assert image.read(0x1000, 0) == b""
    assert image.find(0x1010) is None
    assert Image().read(0, 16) == b""


def test_asid_wildcards():
    assert Asid().matches(Asid(cr3=1, vmcs=2))
    assert Asid(cr3=1).matches(Asid(cr3=1, vmcs=2))
    assert not Asid(cr3=1).matches(Asid(cr3=2))
    assert not Asid(cr3=1, vmcs=2).matches(Asid(cr3=1, vmcs=3))
    assert Asid(cr3=1).matches(Asid(vmcs=3))

    image = Image()
    kernel = image.add_section(mem(0xFFFF_8000_0000_0000, 0xCC, 0x100))  # every process
    image.add_section(mem(0x400000, 1, 0x100), Asid(cr3=0x1000))
    image.add_section(mem(0x400000, 2, 0x100), Asid(cr3=0x2000))
    assert image.read(0x400000, 1, Asid(cr3=0x1000)) == b"\x01"
    assert image.read(0x400000, 1, Asid(cr3=0x2000, vmcs=0x77)) == b"\x02"
    assert image.read(0x400000, 1, Asid(cr3=0x3000)) == b""
    assert image.find(0xFFFF_8000_0000_0010, Asid(cr3=0x3000)) is kernel
    # a query with wildcards sees every space; the newest mapping wins
    assert image.read(0x400000, 1) == b"\x02"
    assert len(image) == 3
    assert sorted(str(a) for a, _ in image.mappings()) == [
        "cr3=*, vmcs=*",
        "cr3=0x1000, vmcs=*",
        "cr3=0x2000, vmcs=*",
    ]

    # mapping into one process cuts the shared mapping underneath (libipt)
    image.add_section(mem(0xFFFF_8000_0000_0040, 0xDD, 0x10), Asid(cr3=0x1000))
    assert image.read(0xFFFF_8000_0000_0040, 1, Asid(cr3=0x1000)) == b"\xdd"
    assert image.read(0xFFFF_8000_0000_0040, 1, Asid(cr3=0x2000)) == b""

    assert image.remove(asid=Asid(cr3=0x2000)) == 3  # its own and the wildcard pieces
    assert image.read(0x400000, 1, Asid(cr3=0x1000)) == b"\x01"
    assert image.remove() == 2
    assert len(image) == 0


def test_remove_by_filename_and_copy(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"A" * 64)
    b.write_bytes(b"B" * 64)
    image = Image("proc")
    image.add_raw(a, 0, None, 0x1000)
    image.add_raw(b, 0, None, 0x1020)
    image.add_raw(a, 0, None, 0x5000, Asid(cr3=7))
    clone = image.copy()
    assert image.remove(a, Asid(cr3=8)) == 1  # the wildcard one matches, cr3=7 does not
    assert image.read(0x1000, 64) == b""
    assert image.read(0x5000, 4, Asid(cr3=7)) == b"AAAA"
    assert clone.read(0x1000, 64) == b"A" * 32 and len(clone) == 3
    assert repr(clone) == "Image('proc', 3 sections, 2 address spaces)"


def test_section_from_bytes_is_read_only_copy():
    buffer = bytearray(b"\x90\xc3")
    section = Section.from_bytes(buffer, 0x10)
    buffer[0] = 0
    assert section.data.tobytes() == b"\x90\xc3"
    assert not section.data.flags.writeable
    with pytest.raises(ImageError):
        Section.from_bytes(b"", 0x10)
    with pytest.raises(ImageError, match="do not fit in 64 bits"):
        Section.from_bytes(b"ab", (1 << 64) - 1)


ASIDS = [Asid(), Asid(cr3=1), Asid(cr3=2), Asid(cr3=1, vmcs=7), Asid(vmcs=7)]
ADDS = st.lists(
    st.tuples(st.integers(0, 64), st.integers(1, 24), st.sampled_from(range(len(ASIDS)))),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(ADDS)
def test_overlaps_match_a_byte_model(adds):
    """Every add cuts matching spaces; a read returns the newest piece's bytes up to its end."""
    image = Image()
    model = {}  # asid -> {address: (byte, generation)}
    for generation, (address, size, which) in enumerate(adds, 1):
        asid = ASIDS[which]
        payload = bytes((generation * 37 + i) & 0xFF for i in range(size))
        image.add_section(Section.from_bytes(payload, address), asid)
        for key, space in model.items():
            if key.matches(asid):
                for a in range(address, address + size):
                    space.pop(a, None)
        space = model.setdefault(asid, {})
        for i, byte in enumerate(payload):
            space[address + i] = (byte, generation)

    pieces = sum(
        1
        for space in model.values()
        for a, (_, g) in space.items()
        if space.get(a - 1, (0, -1))[1] != g
    )
    assert len(image) == pieces
    for query in ASIDS:
        for address in range(0, 92):
            hits = [
                (space[address][1], key)
                for key, space in model.items()
                if key.matches(query) and address in space
            ]
            expected = b""
            if hits:
                generation, key = max(hits, key=lambda h: h[0])
                space, run = model[key], []
                while len(run) < 32 and space.get(address + len(run), (0, -1))[1] == generation:
                    run.append(space[address + len(run)][0])
                expected = bytes(run)
            assert image.read(address, 32, query) == expected, (query, address)


# -- symbol tables ---------------------------------------------------------------


def test_symbol_table_lookup_handles_nesting_and_gaps():
    table = SymbolTable.from_symbols(
        [
            (0x1000, 0x100, "outer", True),
            (0x1010, 0x10, "inner", True),
            (0x2000, 0x8, "data", False),
            (0x3000, 0, "sizeless", True),  # dropped
        ],
        module="a.out",
    )
    assert len(table) == 3
    index, offset = table.lookup([0x0FFF, 0x1000, 0x1012, 0x1020, 0x10FF, 0x1100, 0x2004, 0x3000])
    names = [table.name(i) if i >= 0 else None for i in index]
    assert names == [None, "outer", "inner", "outer", "outer", None, "data", None]
    assert offset.tolist() == [0, 0, 2, 0x20, 0xFF, 0, 4, 0]
    assert table.symbolize(0x1012) == "inner+0x2"
    assert table.symbolize(0x1012, with_module=True) == "a.out!inner+0x2"
    assert table.symbolize(0x1100) == ""
    assert [n for *_, n, _ in table.functions] == ["outer", "inner"]
    moved = table.relocate(0x10000, "lib.so")
    assert moved.symbolize(0x11012, with_module=True) == "lib.so!inner+0x2"
    assert SymbolTable.empty().symbolize(0x1000) == ""
    assert SymbolTable.empty().lookup(np.array([1, 2], np.uint64))[0].tolist() == [-1, -1]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 5)), max_size=30),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
)
def test_symbol_table_order_whether_given_sorted_or_not(syms, presorted, bias):
    """A table's rows are in lexsort's order (start, larger first where
    starts tie, stable) whether they come sorted (a relocated table, which
    skips the sort) or not, and a relocation that wraps around 2**64 sorts
    again."""
    start = np.array([a for a, _ in syms], np.uint64)
    size = np.array([b for _, b in syms], np.uint64)
    if presorted:
        order = np.lexsort((~size, start))
        start, size = start[order], size[order]
    names = [str(i) for i in range(len(syms))]
    table = SymbolTable(start, size, np.arange(len(syms)), names)
    want = np.lexsort((~size, start))
    assert table.start.tolist() == start[want].tolist()
    assert table.name_index.tolist() == want.tolist()
    moved = table.relocate(bias)
    moved_start = table.start + np.uint64(bias % 2**64)
    again = np.lexsort((~table.size, moved_start))
    assert moved.start.tolist() == moved_start[again].tolist()
    assert moved.name_index.tolist() == table.name_index[again].tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(1, 60)), min_size=1, max_size=30),
    st.lists(st.integers(0, 300), max_size=200),
)
def test_compiled_symbol_lookup_equals_the_vectorised_rule(syms, addrs):
    """The compiled lookup remembers the last interval between symbol
    starts, and many addresses at once go through a memo of those met
    before; its answers are the searchsorted rule's for any nesting, with
    the top address, address 0 and jumps back and forth."""
    start = np.array([a for a, _ in syms], np.uint64)
    table = SymbolTable(start, np.array([b for _, b in syms], np.uint64),
                        np.arange(len(syms)), [str(i) for i in range(len(syms))])  # fmt: skip
    addr = np.concatenate([np.array(addrs, np.uint64),
                           np.array([2**64 - 1, 5, 0, 2**64 - 1, 250], np.uint64)])  # fmt: skip
    last = np.searchsorted(table.start, addr, side="right").astype(np.int64) - 1
    idx = np.maximum(last, 0)
    inside = (last >= 0) & (addr < table.end[idx])
    outer = table._cover[idx]
    in_outer = (last >= 0) & ~inside & (addr < table.end[outer])
    want = np.where(inside, idx, np.where(in_outer, outer, -1))
    assert table.index_of(addr).tolist() == want.tolist()
    times = 1 + 600 // addr.shape[0]
    for _ in range(2):  # (the memo empty, then filled)
        assert table.index_of(np.tile(addr, times)).tolist() == np.tile(want, times).tolist()


def test_a_stripped_library_s_symbols_come_from_its_debug_file():
    """ld.so keeps only its dynamic symbols; its detached debug file
    (Debian's libc6-dbg, by build id) has the rest, as perf finds them."""
    import glob
    import os

    from hwtrace.image.elf import _detached_debug, read_elf
    from hwtrace.image.elfheaders import ElfHeaders

    ld = next((p for p in glob.glob("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
               if os.path.isfile(p)), None)  # fmt: skip
    if ld is None:
        pytest.skip("no x86-64 ld.so here")
    from elftools.elf.elffile import ELFFile

    with open(ld, "rb") as f:  # pyelftools reads the build id as a second opinion
        notes = [n for sec in ELFFile(f).iter_sections() if sec["sh_type"] == "SHT_NOTE"
                 for n in sec.iter_notes() if n["n_type"] == "NT_GNU_BUILD_ID"]  # fmt: skip
    build_id = ElfHeaders(ld).build_id()
    assert notes and build_id == bytes.fromhex(notes[0]["n_desc"])
    debug = _detached_debug(build_id)
    if debug is None:
        pytest.skip("no detached debug file for ld.so (Debian: apt-get install libc6-dbg)")
    names = set(read_elf(ld).symbols.names)
    assert "_dl_fixup" in names and "_dl_lookup_symbol_x" in names


def test_c_strings_cut_a_string_table_as_find_and_decode_would() -> None:
    import numpy as np

    from hwtrace.image.elf import c_strings

    def by_find(table: bytes, offsets: list[int]) -> list[str]:
        out = []
        for start in offsets:
            stop = table.find(b"\0", start)
            out.append(table[start : stop if stop >= 0 else len(table)].decode("utf-8", "replace"))
        return out

    for table in (b"\0main\0_start\0memcpy", b"\0caf\xc3\xa9\0bad\xff\0", b"", b"abc"):
        offsets = list(range(len(table) + 3))  # suffixes, NULs, past the end
        got = c_strings(table, np.array(offsets, np.uint32))
        assert got == by_find(table, offsets)


_SYSTEM_LIBS = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libz.so.1")


@pytest.mark.parametrize("lib", _SYSTEM_LIBS)
def test_elf_symbols_keep_one_name_per_address_as_pyelftools_reads_them(lib: str) -> None:
    """A real library's symbols, one name per (start, size): the one the
    rule picks among what pyelftools reads from the same tables (a
    function over an object, global over weak over local, fewer leading
    underscores, shorter, first met)."""
    import os

    from hwtrace.image.elf import _read_symbols
    from hwtrace.image.elfheaders import ElfHeaders

    path = next((os.path.join(d, lib) for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
                 if os.path.exists(os.path.join(d, lib))), None)  # fmt: skip
    if path is None:
        pytest.skip(f"{lib} is not installed here")
    head = ElfHeaders(path)
    tables = head.symbol_tables()
    got = _read_symbols(path, head.buf, tables, head.elfclass, head.little)
    kinds = {"STT_OBJECT": 0, "STT_FUNC": 1, "STT_LOOS": 2, "STT_GNU_IFUNC": 2}
    binds = {"STB_GLOBAL": 0, "STB_WEAK": 1, "STB_LOCAL": 2}
    rows = []
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for name, *_ in tables:
            for sym in elf.get_section_by_name(name).iter_symbols():
                kind = kinds.get(sym["st_info"]["type"])
                shndx = sym["st_shndx"]
                if kind is None or not sym["st_size"] or not isinstance(shndx, int) or not shndx:
                    continue
                n = sym.name
                rows.append((sym["st_value"], sym["st_size"], -kind,
                             binds.get(sym["st_info"]["bind"], 3), len(n) - len(n.lstrip("_")),
                             len(n), len(rows), n, kind))  # fmt: skip
    rows.sort()
    best = [r for i, r in enumerate(rows) if i == 0 or r[:2] != rows[i - 1][:2]]
    best.sort(key=lambda r: (r[0], -r[1]))  # (a table's order: the larger first at a start)
    assert len(best) > 50
    assert got.start.tolist() == [r[0] for r in best]
    assert got.size.tolist() == [r[1] for r in best]
    assert [got.names[i] for i in got.name_index] == [r[7] for r in best]
    assert got.kind.tolist() == [r[8] for r in best]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=12), max_size=12), st.lists(st.integers(0, 200), max_size=30))
def test_names_measured_in_place_as_when_decoded(words, offsets) -> None:
    """The leading underscores and lengths of a string table's names,
    measured on its bytes, are those of the names decoded (UTF-8 with bad
    bytes replaced, as c_strings decodes them)."""
    from hwtrace.image.elf import (
        _is_ascii,
        _leading_underscores,
        _name_lengths,
        _string_bounds,
        c_strings,
    )

    raw = b"\0".join(words)
    table = np.frombuffer(raw, np.uint8)
    offs = np.array(offsets, np.uint32)
    names = c_strings(raw, offs)
    starts, ends = _string_bounds(table, offs)
    assert _leading_underscores(table, starts, ends).tolist() == [
        len(n) - len(n.lstrip("_")) for n in names
    ]
    assert _name_lengths(table, starts, ends, _is_ascii(table)).tolist() == [len(n) for n in names]


def test_symbols_kept_in_the_cache_are_the_ones_read(tmp_path, monkeypatch) -> None:
    """A library's symbol table comes back from the user's cache the same
    as read; a changed file or a damaged cache entry is read again."""
    import os
    import shutil

    from hwtrace.image import elf as E

    lib = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libz.so.1")
                if os.path.exists(p)), None)  # fmt: skip
    if lib is None:
        pytest.skip("no system library to read")
    monkeypatch.setenv("HWTRACE_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "lib.so"
    shutil.copy(lib, copy)

    def table(no_cache: bool) -> tuple:
        E._READ.clear()
        monkeypatch.setenv("HWTRACE_NO_SYMBOL_CACHE", "1" if no_cache else "0")
        t = E.read_elf(copy).symbols
        return (t.start.tolist(), t.size.tolist(), [t.names[i] for i in t.name_index],
                t.kind.tolist(), t.module.tolist(), list(t.modules))  # fmt: skip

    want = table(True)
    assert not (tmp_path / "cache").exists()
    assert table(False) == want  # read, and kept
    (entry,) = (tmp_path / "cache" / "elf-symbols").iterdir()
    calls = []
    real = E._read_symbols
    monkeypatch.setattr(E, "_read_symbols", lambda *a: calls.append(a) or real(*a))
    assert table(False) == want and not calls  # from the cache
    entry.write_bytes(b"\x00damaged")
    assert table(False) == want and calls  # read again
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    calls.clear()
    assert table(False) == want and calls  # another file now: read
    assert len(list((tmp_path / "cache" / "elf-symbols").iterdir())) == 2


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    tables=st.integers(1, 6),
    spread=st.sampled_from([1 << 12, 1 << 40]),
)
def test_symbol_tables_merged_are_those_sorted_whole(seed, tables, spread):
    """Tables merged (a process's files, the kernel's, the JIT code's):
    the same rows as their symbols sorted together, whether their
    address ranges lie apart (laid end to end, not sorted) or
    interleave, equal starts and sizes kept in order."""
    rng = np.random.default_rng(seed)
    parts = []
    for k in range(tables):
        n = int(rng.integers(1, 30))
        base = int(rng.integers(0, spread))
        start = np.sort(rng.integers(base, base + 5000, n)).astype(np.uint64)
        if k % 3 == 2:
            start = start + np.uint64(0xFFFF_8000_0000_0000)  # (kernel addresses)
        size = rng.integers(1, 64, n).astype(np.uint64)
        parts.append(SymbolTable(start, size, np.arange(n), [f"t{k}s{i}" for i in range(n)],
                                 rng.integers(0, 2, n), np.zeros(n, np.int32), [f"m{k}"]))  # fmt: skip
    got = SymbolTable.merge(parts)
    start = np.concatenate([t.start for t in parts])
    size = np.concatenate([t.size for t in parts])
    order = np.lexsort((~size, start))
    names = [t.name(i) for t in parts for i in range(len(t))]
    modules = [t.module_name(i) for t in parts for i in range(len(t))]
    kinds = np.concatenate([t.kind for t in parts])
    assert (got.start == start[order]).all() and (got.size == size[order]).all()
    assert (got.kind == kinds[order]).all()
    assert [got.name(i) for i in range(len(got))] == [names[j] for j in order.tolist()]
    assert [got.module_name(i) for i in range(len(got))] == [modules[j] for j in order.tolist()]
