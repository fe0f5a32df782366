"""Switching images at tracing enables: how sideband tells the decoder which
process runs (two processes with different code at the same address)."""

import numpy as np
import pytest

from hwtrace.image import Image
from hwtrace.image.sections import Section
from hwtrace.pt.decode import decode_trace
from hwtrace.pt.encode import encode_path

# Process A: a three-round loop, then RET.
CODE_A = bytes.fromhex("31c0" "ffc0" "83f803" "75f9" "c3")  # fmt: skip
PATH_A = [0x1000, *[0x1002, 0x1004, 0x1007] * 3, 0x1009]
# Process B, at the same address: two NOPs and RET.
CODE_B = bytes.fromhex("9090c3")
PATH_B = [0x1000, 0x1001, 0x1002]
# A JMP that runs untraced (outside the filter) between them.
JMP = 0x3000
CODE_JMP = bytes.fromhex("e9fbefffff")  # jmp 0x2000


def image_of(*parts: tuple[int, bytes]) -> Image:
    image = Image()
    for address, code in parts:
        image.add_section(Section.from_bytes(code, address))
    return image


def reader(parts):
    def read(address: int, size: int) -> bytes:
        for base, code in parts:
            if base <= address < base + len(code):
                return code[address - base : address - base + size]
        return b""

    return read


@pytest.mark.parametrize("jobs", [1, 2])
def test_context_switches_image_at_each_psb_enable(jobs):
    a = encode_path(
        np.array(PATH_A, np.uint64), reader([(0x1000, CODE_A)]), end_ip=0x5000, tsc=1000
    )
    b = encode_path(
        np.array(PATH_B, np.uint64), reader([(0x1000, CODE_B)]), end_ip=0x6000, tsc=9000
    )
    trace = a.data + b.data
    image_a, image_b = image_of((0x1000, CODE_A)), image_of((0x1000, CODE_B))
    asked = []

    def context(tsc, ip):
        asked.append((tsc, ip))
        return image_a if tsc is not None and tsc < 5000 else image_b

    got = decode_trace(
        trace, image_a, a.config, context=context, jobs=jobs, chunk_bytes=64, job_bytes=0
    )
    assert not got.gaps
    assert got.instructions().tolist() == PATH_A + PATH_B
    assert (1000, 0x1000) in asked and any(t is not None and t >= 9000 for t, _ in asked)
    # Without the context, B's trace is walked over A's code and goes wrong.
    wrong = decode_trace(trace, image_a, a.config)
    assert wrong.instructions().tolist() != PATH_A + PATH_B


def test_context_switches_image_at_tip_pge():
    # A runs, its RET goes to a JMP outside the filter (untraced), and B's
    # code (placed at 0x2000) is entered with TIP.PGE.
    parts = [(0x1000, CODE_A), (0x2000, CODE_B), (JMP, CODE_JMP)]
    ips = np.array([*PATH_A, JMP, 0x2000, 0x2001, 0x2002], np.uint64)
    enc = encode_path(ips, reader(parts), end_ip=0x6000, trace_off=[(len(PATH_A), len(PATH_A) + 1)])
    image_a = image_of((0x1000, CODE_A))
    image_b = image_of((0x2000, CODE_B))

    def context(tsc, ip):
        return image_b if ip >= 0x2000 else image_a

    got = decode_trace(enc.data, image_a, enc.config, context=context)
    assert not got.gaps
    assert got.instructions().tolist() == [*PATH_A, 0x2000, 0x2001, 0x2002]
    # Without it, B's code is missing from A's image: a gap, A's part kept.
    alone = decode_trace(enc.data, image_a, enc.config)
    assert alone.gaps and alone.instructions().tolist()[: len(PATH_A)] == PATH_A


def test_an_image_grown_from_the_last_keeps_its_code():
    """A process that maps more code (B's, at 0x2000, entered with
    TIP.PGE) gets an image grown from the one decoded before: the decoder
    goes on with that one's code table (A's code is not decoded again)
    and both images' blocks list from it."""
    parts = [(0x1000, CODE_A), (0x2000, CODE_B), (JMP, CODE_JMP)]
    ips = np.array([*PATH_A, JMP, 0x2000, 0x2001, 0x2002], np.uint64)
    enc = encode_path(ips, reader(parts), end_ip=0x6000, trace_off=[(len(PATH_A), len(PATH_A) + 1)])
    image_a = image_of((0x1000, CODE_A))
    image_ab = image_a.copy()
    image_ab.add_section(Section.from_bytes(CODE_B, 0x2000))
    assert image_ab.added_since(image_a) == [(0x2000, 0x2000 + len(CODE_B))]
    assert image_a.added_since(image_ab) is None

    def context(tsc, ip):
        return image_ab if ip >= 0x2000 else image_a

    got = decode_trace(enc.data, image_a, enc.config, context=context)
    assert not got.gaps
    assert got.instructions().tolist() == [*PATH_A, 0x2000, 0x2001, 0x2002]
    (view_a,), (view_ab,) = got.code.values()
    assert view_a is view_ab


def test_a_grown_image_does_not_keep_code_that_ended_where_it_adds():
    """Where the table holds an address the old image did not map (the
    decoder found no code there), the grown image's code table is a new
    one: the address holds code now."""
    from hwtrace.pt.codetable import CodeTable

    image_a = image_of((0x1000, CODE_A))
    table = CodeTable(image_a)
    table.fill(0x1000, 64)
    table.fill(0x2000, 64)  # (nothing mapped there: an error entry)
    image_ab = image_a.copy()
    image_ab.add_section(Section.from_bytes(CODE_B, 0x2000))
    assert not table.extend_to(image_ab)
    assert table.image is image_a
    clean = CodeTable(image_a)
    clean.fill(0x1000, 64)
    n = clean.n_insns
    assert clean.extend_to(image_ab) and clean.image is image_ab and clean.n_insns == n
    clean.fill(0x2000, 64)
    assert clean.lookup(0x2000, 64) >= 0 and clean.i_err[clean.lookup(0x2000, 64)] == 0


def test_code_missed_in_a_section_read_before_is_decoded_in_the_flow_loop(monkeypatch):
    """Indirect jumps (TIP) to 40 stretches of code no fill reached ahead:
    Python fills the first (reading its section), the flow loop the rest
    by itself."""
    from hwtrace.pt.codetable import CodeTable

    n = 40
    code = bytearray(b"\x90" * (0x100 * n))
    for k in range(n):
        code[0x100 * k : 0x100 * k + 3] = b"\x90\xff\xe0"  # nop; jmp *%rax
    ips = [a for k in range(n) for a in (0x1000 + 0x100 * k, 0x1001 + 0x100 * k)]
    enc = encode_path(np.array(ips, np.uint64), reader([(0x1000, bytes(code))]), end_ip=0x9000)
    fills = []
    fill = CodeTable.fill
    monkeypatch.setattr(
        CodeTable, "fill", lambda self, ip, mode: (fills.append(ip), fill(self, ip, mode))[1]
    )
    got = decode_trace(enc.data, image_of((0x1000, bytes(code))), enc.config)
    assert got.instructions().tolist() == ips
    assert fills == [0x1000]


def test_code_tables_share_the_copy_of_a_section_they_both_map():
    """Two processes' images holding the same section object (a kernel's
    text is in every one) copy its bytes for their flow loops once."""
    from hwtrace.pt.codetable import CodeTable, _code_arena

    shared = Section.from_bytes(CODE_A, 0x1000)
    a, b = Image(), Image()
    for image, own in ((a, CODE_B), (b, CODE_JMP)):
        image.add_section(shared)
        image.add_section(Section.from_bytes(own, 0x2000))
    arena = _code_arena()
    ta, tb = CodeTable(a), CodeTable(b)
    ta.fill(0x1000, 64)
    used = arena.used
    tb.fill(0x1000, 64)
    assert arena.used == used
    assert ta.code_space()[2].tolist() == tb.code_space()[2].tolist()
    for t in (ta, tb):
        t.fill(0x2000, 64)
    assert arena.used == used + len(CODE_B) + len(CODE_JMP)


def test_sections_of_the_same_file_bytes_share_one_copy(tmp_path):
    """Each program a process exec's maps the same library anew: its
    sections, cut from the one memory map of the file, are copied for the
    flow loops once, while a section of other bytes (another part of the
    file) gets its own copy, and a copy outlives no section."""
    import gc

    from hwtrace.pt.codetable import CodeTable, _code_arena

    f = tmp_path / "lib.bin"
    f.write_bytes(CODE_A + CODE_B)
    arena = _code_arena()
    first = Section.from_file(f, 0, len(CODE_A), 0x1000)
    again = Section.from_file(f, 0, len(CODE_A), 0x1000)
    other = Section.from_file(f, len(CODE_A), len(CODE_B), 0x1000)
    tables = []
    for section in (first, again, other):
        image = Image()
        image.add_section(section)
        tables.append(CodeTable(image))
    tables[0].fill(0x1000, 64)
    used = arena.used
    tables[1].fill(0x1000, 64)
    assert arena.used == used
    assert tables[0].code_space()[2].tolist() == tables[1].code_space()[2].tolist()
    tables[2].fill(0x1000, 64)
    assert arena.used == used + len(CODE_B)
    at = arena.at[other]
    assert bytes(arena.data[at : at + len(CODE_B)]) == CODE_B
    mine = [(s.data.__array_interface__["data"][0], s.data.shape[0]) for s in (first, other)]
    del tables, image, first, again, other, section
    gc.collect()
    assert all(arena.by_bytes[k][1]() is None for k in mine if k in arena.by_bytes)


def test_blocks_after_an_image_grew_are_named_in_it():
    """The decoder storing its rows itself names a block by its image's
    number: after the process mapped more code (the image grown, its code
    table kept), A's blocks met again are the grown image's, as the rows
    it writes out name them, not the keys it found for them before."""
    parts = [(0x1000, CODE_A), (0x2000, CODE_B), (JMP, CODE_JMP)]
    ips = np.array([*PATH_A, JMP, 0x2000, 0x2001, 0x2002, *PATH_A], np.uint64)
    enc = encode_path(ips, reader(parts), end_ip=0x6000, trace_off=[(len(PATH_A), len(PATH_A) + 1)])
    image_a = image_of((0x1000, CODE_A))
    image_ab = image_a.copy()
    image_ab.add_section(Section.from_bytes(CODE_B, 0x2000))

    def context(tsc, ip):
        return image_ab if ip >= 0x2000 else image_a

    got = decode_trace(enc.data, image_a, enc.config, context=context, keep_blocks=True)
    assert not got.gaps
    assert got.instructions().tolist() == [*PATH_A, 0x2000, 0x2001, 0x2002, *PATH_A]
    ip = np.asarray(got.block_ip)
    image = np.asarray(got.block_image)
    grown = int(image[np.flatnonzero(ip == 0x2000)[0]])
    after = np.flatnonzero(ip == 0x2000)[0]
    assert (image[after:] == grown).all() and (image[:after] != grown).all()
