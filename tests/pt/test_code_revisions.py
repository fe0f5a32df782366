"""The code-revision store and the JIT sources that feed it: perf's
jitdump files and perf maps (hypothesis-fuzzed readers)."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.image import Asid
from hwtrace.image.jitdump import (
    JitCode,
    encode_jitdump,
    read_jitdump,
    read_perf_map,
)
from hwtrace.image.revisions import CodeRevisions

NOP5 = bytes.fromhex("0f1f440000")
JMP5 = bytes.fromhex("e9 10 00 00 00")


def test_revision_in_force_at_each_time():
    store = CodeRevisions()
    base = 0x401000
    store.add(base, NOP5 + b"\xc3", 0, "elf")
    store.add(base, JMP5 + b"\xc3", 100, "capture", tid=7, cpu=1, tsc=100, ip=base)
    store.add(base, NOP5 + b"\xc3", 200, "capture")
    assert store.read(base, 5, 50) == NOP5
    assert store.read(base, 5, 100) == JMP5
    assert store.read(base, 5, 150) == JMP5
    assert store.read(base, 5, 250) == NOP5
    assert store.read(base, 5, -1) is None  # before any revision
    now, before = store.around(base, 150)
    assert now.data[:5] == JMP5 and before.data[:5] == NOP5
    assert now.tid == 7 and now.ip == base
    assert store.differs_from(base, NOP5, 150) and not store.differs_from(base, NOP5, 250)


def test_rewrites_name_the_bytes_that_changed():
    """What a decoder that cannot place a revision checks: which bytes it
    changed, against the files' and the revisions before it (in time
    order, then in the order added, for revisions of the same time); new
    code replaces nothing."""
    from hwtrace.image import Image, Section

    files = Image("files")
    files.add_section(Section.from_bytes(NOP5 + b"\xc3", 0x401000, "text"))
    store = CodeRevisions()
    key = store.add(0x401000, JMP5 + b"\xc3", 100, "capture")
    jit = store.add(0x500000, b"\x31\xc0\xc3", 50, "capture")
    again = store.add(0x500000, b"\x31\xc9\xc3", 50, "text_poke")  # same time, added later
    rewrites = store.rewrites(files)
    assert set(rewrites) == {key.id, again.id}
    assert rewrites[key.id].tolist() == [True, True, True, False, False, False]
    assert rewrites[again.id].tolist() == [False, True, False]
    assert jit.id not in store.rewrites(None) and key.id not in store.rewrites(None)
    # Epochs: [50], [100]; the revisions after epoch 1 up to epoch 2.
    assert store.between(1, 2) == [key] and store.between(0, 1) == [jit, again]
    assert store.between(2, 2) == [] and store.between(0, 2) == [jit, again, key]


def test_unchanged_bytes_are_not_a_new_revision():
    store = CodeRevisions()
    assert store.add(0x1000, b"\x90\xc3", 0, "capture") is not None
    assert store.add(0x1000, b"\x90\xc3", 10, "capture") is None
    assert len(store) == 1


def test_partial_rewrite_is_read_piece_by_piece():
    store = CodeRevisions()
    store.add(0x1000, bytes(16), 0, "capture")
    store.add(0x1004, b"\xcc", 5, "text_poke")
    assert store.read(0x1000, 4, 10) == bytes(4)  # untouched bytes: the old revision
    # Across the poke: each byte from the revision in force over it; no
    # single revision holds the range.
    assert store.read(0x1000, 8, 10) == bytes(4) + b"\xcc" + bytes(3)
    assert store.at(0x1000, 10, size=8) is None
    assert store.read(0x0FFF, 2, 10) is None  # a byte no revision holds
    assert store.read(0x1004, 1, 10) == b"\xcc"
    assert store.read(0x1000, 8, 4) == bytes(8)  # before the poke


def test_address_spaces_are_apart():
    store = CodeRevisions()
    a, b = Asid(cr3=0x1000), Asid(cr3=0x2000)
    store.add(0x400000, b"\x90", 0, "capture", asid=a)
    store.add(0x400000, b"\xc3", 0, "capture", asid=b)
    assert store.read(0x400000, 1, 1, asid=a) == b"\x90"
    assert store.read(0x400000, 1, 1, asid=b) == b"\xc3"
    assert not store.conflicts


def test_sources_that_disagree_are_a_conflict():
    store = CodeRevisions()
    store.add(0x7F00, b"\x55\x48\x89\xe5", 10, "jitdump", name="fn")
    store.add(0x7F00, b"\x55\x48\x89\xe6", 10, "capture")
    assert len(store.conflicts) == 1
    c = store.conflicts[0]
    assert c.address == 0x7F03 and "jitdump and capture disagree" in str(c)


def _codes() -> list[JitCode]:
    return [
        JitCode("js:fib", 0x7F0000001000, 6, 111, 42, 43, b"\x55\x48\x89\xe5\x5d\xc3",
                lines=[(0x7F0000001000, 3, "fib.js"), (0x7F0000001004, 4, "fib.js")]),
        JitCode("py:loop", 0x7F0000002000, 2, 222, 42, 44, b"\x90\xc3", moved=[(333, 0x7F0000003000)]),
    ]  # fmt: skip


def test_jitdump_round_trip():
    data = encode_jitdump(42, _codes(), timestamp=7, flags=1)
    dump = read_jitdump("jit-42.dump", data, pid=42)
    assert not dump.problems and dump.closed and dump.pid == 42 and dump.tsc_timestamps
    got = dump.codes
    assert [(c.name, c.address, c.code, c.time, c.tid) for c in got] == [
        (c.name, c.address, c.code, c.time, c.tid) for c in _codes()
    ]
    assert got[0].lines == _codes()[0].lines
    assert got[1].moved == [(333, 0x7F0000003000)]


def test_jitdump_of_another_process_and_truncation():
    data = encode_jitdump(42, _codes())
    other = read_jitdump("x", data, pid=99)
    assert not other.codes and "written by process 42, not 99" in str(other.problems[0])
    cut = read_jitdump("x", data[: len(data) - 30])  # into the move record; no close
    assert [c.name for c in cut.codes] == ["js:fib", "py:loop"] and not cut.codes[1].moved
    assert len(cut.problems) == 1 and not cut.closed
    assert "runs past the end" in str(cut.problems[0]) and "offset 0x" in str(cut.problems[0])
    bad = read_jitdump("x", b"ELF\x7f" + bytes(60))
    assert "not a jitdump file" in str(bad.problems[0])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 399))
def test_jitdump_reader_takes_any_damage(noise, cut):
    data = bytearray(encode_jitdump(42, _codes()))
    at = cut % len(data)
    data[at : at + len(noise)] = noise
    dump = read_jitdump("fuzz", bytes(data))
    for c in dump.codes:
        assert len(c.code) == c.size
    for p in dump.problems:
        assert str(p).startswith("fuzz: ")


def test_perf_map():
    text = "7f0000001000 20 py::fib:/app/fib.py\nnot a line\n7f0000002000 8 [stub]\n\n"
    entries, problems = read_perf_map("/tmp/perf-1.map", text)
    assert [(e.address, e.size, e.name) for e in entries] == [
        (0x7F0000001000, 0x20, "py::fib:/app/fib.py"), (0x7F0000002000, 8, "[stub]"),
    ]  # fmt: skip
    assert len(problems) == 1 and "line 2" in str(problems[0])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_perf_map_reader_takes_any_text(text):
    entries, problems = read_perf_map("m", text)
    assert all(e.address >= 0 and e.size >= 0 for e in entries)
    assert len(entries) + len(problems) <= len(text.splitlines())


def test_header_fields():
    data = encode_jitdump(5, [])
    magic, version, size = struct.unpack_from("<III", data)
    assert (magic, version, size) == (0x4A695444, 1, 40)


def _python(version: str) -> str | None:
    import glob
    import shutil

    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}*/bin/python3"))
    return found[-1] if found else shutil.which(f"python{version}")


def test_real_cpython_jitdump_and_perf_map(tmp_path):
    """CPython 3.13's -X perf_jit writes a jitdump, 3.12's -X perf a perf
    map: real JIT output read whole."""
    import os
    import subprocess

    import pytest

    py13, py12 = _python("3.13"), _python("3.12")
    if py13 is None and py12 is None:
        pytest.skip("no CPython 3.12 or 3.13 here (pyenv) to write real jitdump/perf map files")
    prog = "def f(n):\n    return n if n < 2 else f(n - 1) + f(n - 2)\nimport os\nprint(f(12), os.getpid())\n"
    if py13 is not None:
        r = subprocess.run(
            [py13, "-X", "perf_jit", "-c", prog], capture_output=True, text=True, cwd=tmp_path
        )
        pid = int(r.stdout.split()[1])
        path = f"/tmp/jit-{pid}.dump"
        try:
            dump = read_jitdump(path, pid=pid)
        finally:
            os.unlink(path)
        assert not dump.problems and dump.pid == pid
        names = [c.name for c in dump.codes]
        assert any(n.startswith("py::f:") for n in names)
        assert all(len(c.code) == c.size > 0 for c in dump.codes)
        store = CodeRevisions()
        for c in dump.codes:
            store.add(c.address, c.code, c.time, "jitdump", tid=c.tid, name=c.name)
        assert not store.conflicts
    if py12 is not None:
        r = subprocess.run([py12, "-X", "perf", "-c", prog], capture_output=True, text=True)
        pid = int(r.stdout.split()[1])
        path = f"/tmp/perf-{pid}.map"
        try:
            entries, problems = read_perf_map(path)
        finally:
            os.unlink(path)
        assert not problems and any(e.name.startswith("py::f:") for e in entries)


def test_text_pokes_and_ksymbols_from_perf_data(tmp_path):
    """TEXT_POKE records become revisions at their times (the old bytes
    before); KSYMBOL registrations pair with their unregistrations."""
    from hwtrace.perf.attr import PerfEventAttr
    from hwtrace.perf.code import add_text_pokes, ksymbols
    from hwtrace.perf.data import read_perf_data
    from hwtrace.perf.records import Ksymbol, SampleId, SampleType, TextPoke
    from hwtrace.perf.writer import PerfDataWriter

    path = tmp_path / "poke.data"
    attr = PerfEventAttr(type=1, sample_type=int(SampleType.TIME | SampleType.TID), sample_id_all=1,
                         text_poke=1, ksymbol=1)  # fmt: skip
    site = 0xFFFFFFFF81000100
    with PerfDataWriter(path) as w:
        w.add_attr(attr, [1], "dummy:u")
        w.add_record(Ksymbol(0xFFFFFFFFC0001000, 0x80, 1, 0, "bpf_prog_0123456789abcdef_f"),
                     sample_id=SampleId(time=50))  # fmt: skip
        w.add_record(TextPoke(site, NOP5, JMP5), sample_id=SampleId(time=100))
        w.add_record(TextPoke(site, JMP5, NOP5), sample_id=SampleId(time=300))
        w.add_record(Ksymbol(0xFFFFFFFFC0001000, 0x80, 1, 1, "bpf_prog_0123456789abcdef_f"),
                     sample_id=SampleId(time=400))  # fmt: skip
    data = read_perf_data(path)
    store = CodeRevisions()
    assert add_text_pokes(data, store) == 2
    assert store.read(site, 5, 99) == NOP5
    assert store.read(site, 5, 100) == JMP5 and store.read(site, 5, 299) == JMP5
    assert store.read(site, 5, 300) == NOP5
    assert store.at(site, 150).source == "text_poke"
    (sym,) = ksymbols(data)
    assert (sym.name, sym.address, sym.size, sym.start, sym.end) == (
        "bpf_prog_0123456789abcdef_f", 0xFFFFFFFFC0001000, 0x80, 50, 400,
    )  # fmt: skip


def test_live_bpf_images():
    """A loaded BPF program's JIT image, read with BPF_OBJ_GET_INFO_BY_FD,
    lies where /proc/kallsyms says and goes into the store under that name."""
    import os

    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root (BPF programs)")
    from hwtrace.kernel import bpf
    from hwtrace.ktrace.trace import KernelTrace

    with KernelTrace(["sched:sched_switch"], "prev_pid == 1") as t:
        mine = t.events[0].loaded.info()["id"]
        images = [im for im in bpf.loaded_images() if im.id == mine]
        assert len(images) == 1
        im = images[0]
        assert im.code == t.events[0].loaded.jited_bytes() and len(im.code) == sum(im.lengths)
        kallsyms = open("/proc/kallsyms").read()
        if "[bpf]" in kallsyms:
            assert f"{im.addresses[0]:016x} t {im.symbol}\t[bpf]" in kallsyms
        store = CodeRevisions()
        assert bpf.add_images(store, images, 10) == len(im.addresses)
        assert store.read(im.addresses[0], len(im.code), 11) == im.code
        assert store.at(im.addresses[0], 11).name == im.symbol
