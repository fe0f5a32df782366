"""The sideband model: address spaces over time, thread schedules, binaries."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.image.kernelcode import read_kallsyms
from hwtrace.perf.sideband import (
    BinaryLocator,
    Sideband,
    TscConversion,
    elf_build_id,
)

CONV = TscConversion(time_shift=31, time_mult=1_209_591_014, time_zero=-123_456_789 % (1 << 64))


def test_tsc_conversion_is_perfs_formula():
    tsc = 0x1234_5678_9ABC
    quot, rem = tsc >> 31, tsc & ((1 << 31) - 1)
    want = (CONV.time_zero + quot * CONV.time_mult + ((rem * CONV.time_mult) >> 31)) % (1 << 64)
    assert CONV.to_ns(tsc) == want
    many = CONV.to_ns(np.array([tsc, tsc + 1000], np.uint64))
    assert many.dtype == np.uint64 and int(many[0]) == want


@settings(max_examples=300, deadline=None)
@given(st.integers(1 << 30, 1 << 56))
def test_tsc_round_trip(tsc):
    # ns has less resolution than the TSC here (mult/2**shift < 1): the way
    # back lands within one ns worth of TSC ticks, never beyond.
    back = CONV.to_tsc(CONV.to_ns(tsc))
    ticks_per_ns = (1 << 31) / CONV.time_mult
    assert abs(back - tsc) <= ticks_per_ns + 1


def test_address_spaces_follow_fork_and_exec():
    sb = Sideband()
    sb.add_comm(10, 100, 100, "shell")
    sb.add_mmap(20, 100, 0x400000, 0x1000, 0, "/bin/sh")
    sb.add_fork(30, 101, 100, 101, 100)
    sb.add_mmap(40, 100, 0x500000, 0x1000, 0, "/lib/late.so")  # parent only, after the fork
    sb.add_comm(50, 101, 101, "ls", exec=True)
    sb.add_mmap(60, 101, 0x600000, 0x2000, 0x1000, "/bin/ls")
    child_before = sb.space_at(101, 45)
    assert [m.path for m in child_before.mappings] == ["/bin/sh"]
    child_after = sb.space_at(101, 70)
    assert [m.path for m in child_after.mappings] == ["/bin/ls"]
    assert [m.path for m in sb.space_at(100, 70).mappings_at(35)] == ["/bin/sh"]
    assert sb.comm_of(101, 35) == "shell" and sb.comm_of(101) == "ls"
    sb.add_mmap(5, -1, 0xFFFFFFFF81000000, 0x1000000, 0, "[kernel.kallsyms]_text", kernel=True)
    assert sb.kernel_mappings[0].start == 0xFFFFFFFF81000000


def test_threads_on_a_cpu_by_time():
    sb = Sideband()
    for t, tid in ((100, 7), (200, 8), (150, -1), (300, 7)):
        sb.add_switch(t, 2, tid)
    got = sb.threads_on(2, np.array([50, 100, 160, 250, 10_000]))
    assert got.tolist() == [-1, 7, -1, 8, 7]
    assert sb.threads_on(3, np.array([1])).tolist() == [-1]
    assert sb.switch_times(2).tolist() == [100, 150, 200, 300]


def test_locator_reports_missing_and_changed_binaries(tmp_path):
    loc = BinaryLocator(buildid_dirs=())
    assert loc.find("/no/such/binary") is None
    assert "binary not found" in loc.problems["/no/such/binary"]
    exe = sys.executable
    real = elf_build_id(exe)
    if real is None:
        pytest.skip(f"{exe} has no build id")
    assert loc.find(exe, real) is not None
    assert loc.find(exe, bytes(len(real))) is None
    assert "changed since recording" in loc.problems[exe]
    cache = tmp_path / "cache"
    entry = cache / ".build-id" / real.hex()[:2] / real.hex()[2:]
    entry.mkdir(parents=True)
    shutil.copy(exe, entry / "elf")
    assert BinaryLocator(buildid_dirs=(cache,)).find("/gone", real) == entry / "elf"


def test_a_binary_found_in_the_build_id_cache_is_named_as_mapped(tmp_path):
    """A binary found through perf's build-id cache (its copy named
    ``.../elf``) is known by the path the recording mapped: its sections,
    the places of code no symbol covers, and the Parquet images table's
    name for such code (one image, as its symbols have)."""
    from hwtrace.export.parquet import Names
    from hwtrace.image.elf import read_elf

    exe = sys.executable
    real = elf_build_id(exe)
    if real is None:
        pytest.skip(f"{exe} has no build id")
    cache = tmp_path / "cache"
    entry = cache / ".build-id" / real.hex()[:2] / real.hex()[2:]
    entry.mkdir(parents=True)
    shutil.copy(exe, entry / "elf")
    mapped = "/recorded/bin/python-as-run"
    text = next(s for s in read_elf(exe).segments if s.executable)
    base = 0x5555_0000_0000
    start = base + (text.vaddr - text.vaddr % 4096)
    sb = Sideband()
    sb.add_mmap(1, 7, start, text.filesz + text.vaddr % 4096, text.offset - text.vaddr % 4096,
                mapped, build_id=real)  # fmt: skip
    image, _ = sb.space_at(7, 2).image(BinaryLocator(buildid_dirs=(cache,)))
    sections = [s for _, s in image.mappings()]
    assert sections and {s.path for s in sections} == {mapped}
    assert {s.filename for s in sections} == {str(entry / "elf")}
    assert image.locate(sections[0].address).startswith("python-as-run+")
    names = Names()
    _, _, ids = names.sections(image)
    assert set(ids.tolist()) == {names.image(mapped)}
    assert [r.as_py() for r in names.images_table().column("path")] == [mapped]


def test_kallsyms(tmp_path):
    f = tmp_path / "kallsyms"
    f.write_text(
        "ffffffff81000000 T _stext\nffffffff81000100 t helper\n"
        "ffffffff82000000 D some_data\n0000000000000000 T hidden\nffffffff81000200 T last\n"
    )
    table = read_kallsyms(f)
    assert table.symbolize(0xFFFFFFFF81000104) == "helper+0x4"
    assert table.symbolize(0xFFFFFFFF81000000) == "_stext"
    assert len(table) == 3


PROGRAM = r"""
#include <unistd.h>
int work(int x) { return x * 3 + 1; }
int main(void) { char c; read(0, &c, 1); return work(c); }
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_process_image_from_real_maps(tmp_path):
    """The image built from a live PIE process's /proc/PID/maps holds the
    bytes the process has at its symbols' addresses."""
    src = tmp_path / "p.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "p"
    subprocess.run(["gcc", "-O1", "-fPIE", "-pie", "-o", exe, src], check=True)
    proc = subprocess.Popen([exe], stdin=subprocess.PIPE)
    try:
        # Wait until the dynamic loader mapped the program and libc.
        for _ in range(200):
            maps = open(f"/proc/{proc.pid}/maps").read()
            if "libc" in maps:
                break
            subprocess.run(["sleep", "0.01"], check=True)
        sb = Sideband()
        for line in maps.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            sb.add_mmap(1, proc.pid, lo, hi - lo, int(parts[2], 16), parts[5])
        image, symbols = sb.space_at(proc.pid, 2).image(BinaryLocator(buildid_dirs=()))
        names = symbols.functions
        at = {names.name(i): int(names.start[i]) for i in range(len(names))}
        with open(f"/proc/{proc.pid}/mem", "rb") as mem:
            for name in ("work", "main", "read"):
                mem.seek(at[name])
                assert image.read(at[name], 16) == mem.read(16), name
    finally:
        proc.communicate(b"x")


def test_the_build_id_cache_is_perfs_buildid_dir(tmp_path, monkeypatch):
    """perf's ``buildid.dir`` (from the file $PERF_CONFIG names, else
    /etc/perfconfig and ~/.perfconfig, the later winning), else
    ~/.debug: where hwtrace looks for binaries and keeps the vDSO."""
    from hwtrace.perf.perfconfig import buildid_dir, perf_config_value

    monkeypatch.delenv("PERF_CONFIG", raising=False)
    monkeypatch.setenv("PERF_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert buildid_dir() == tmp_path / ".debug"
    assert BinaryLocator().buildid_dirs == (tmp_path / ".debug",)
    (tmp_path / ".perfconfig").write_text(
        "# perf config\n[report]\n\tdir = /not/this\n[buildid]\n"
        '\tdir = "/srv/cache" ; a comment\n[annotate]\n\tdir = /nor/this\n'
    )
    assert buildid_dir() == Path("/srv/cache")
    own = tmp_path / "own.config"
    own.write_text(f"[buildid]\ndir = {tmp_path / 'c'}\n[BuildId]\n  Dir = {tmp_path / 'd'}\n")
    monkeypatch.setenv("PERF_CONFIG", str(own))
    assert buildid_dir() == tmp_path / "d"  # (only that file; the last value)
    assert perf_config_value("report", "dir") is None
    monkeypatch.setenv("PERF_CONFIG", "/dev/null")
    assert buildid_dir() == tmp_path / ".debug"
    monkeypatch.setenv("PERF_CONFIG", str(tmp_path / "no-such-file"))
    assert buildid_dir() == tmp_path / ".debug"
    # vDSOs go there too.
    monkeypatch.setenv("PERF_CONFIG", str(own))
    from hwtrace.perf.sideband import cache_vdso

    got = cache_vdso(b"\x7fELF-bytes", bytes.fromhex("ab" * 20))
    assert got == tmp_path / "d" / "[vdso]" / ("ab" * 20) / "vdso"
    assert BinaryLocator().find("[vdso]", bytes.fromhex("ab" * 20)) is not None


@given(st.text(max_size=300))
@settings(max_examples=200, deadline=None)
def test_any_perf_configuration_text_is_read_without_error(text):
    """A configuration file of any text gives a value or none, never an
    error (perf warns about such a file and goes on)."""
    import os
    import tempfile

    from hwtrace.perf.perfconfig import perf_config_value

    with tempfile.NamedTemporaryFile("w", suffix=".perfconfig", delete=False) as f:
        f.write("[buildid]\n" + text)
    saved = os.environ.get("PERF_CONFIG")
    os.environ["PERF_CONFIG"] = f.name
    try:
        got = perf_config_value("buildid", "dir")
        assert got is None or isinstance(got, str)
    finally:
        os.unlink(f.name)
        if saved is None:
            del os.environ["PERF_CONFIG"]
        else:
            os.environ["PERF_CONFIG"] = saved
