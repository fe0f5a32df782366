"""Intel BTS records (``hwtrace.hwevents.bts``): the codec, events at
registered addresses, and perf.data files perf's own BTS decoder reads."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.hwevents.bts import RECORD, decode_bts, encode_bts, events_at, perf_bts

addresses = st.integers(0, (1 << 64) - 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(addresses, addresses, st.integers(0, 0xFF)), max_size=50),
    st.binary(max_size=23),
)
def test_records_round_trip(branches, tail):
    """Every record comes back but the all-zero ones (skipped, counted);
    zero from/to are kept as begin/end marks; a short tail is reported."""
    src = np.array([b[0] for b in branches], np.uint64)
    dst = np.array([b[1] for b in branches], np.uint64)
    flags = np.array([b[2] for b in branches], np.uint64)
    got = decode_bts(encode_bts(src, dst, flags) + tail, base=100)
    keep = ~((src == 0) & (dst == 0))
    assert np.array_equal(got.source, src[keep]) and np.array_equal(got.target, dst[keep])
    assert np.array_equal(got.flags, flags[keep]) and got.skipped == int((~keep).sum())
    assert np.array_equal(got.offset, 100 + RECORD.itemsize * np.flatnonzero(keep))
    assert np.array_equal(got.begins, np.flatnonzero(src[keep] == 0))
    assert np.array_equal(got.ends, np.flatnonzero(dst[keep] == 0))
    assert got.trailing == len(tail) and bool(got.problems) == bool(tail)


def test_events_at_registered_sites():
    src = np.array([0x10, 0x20, 0x10, 0x30], np.uint64)
    dst = np.array([0x100, 0x200, 0x300, 0x10], np.uint64)
    b = decode_bts(encode_bts(src, dst))
    rows, ids = events_at(b, {0x10: 7, 0x30: 9})
    assert rows.tolist() == [0, 2, 3] and ids.tolist() == [7, 7, 9]
    rows, ids = events_at(b, {0x10: 1}, by="target")
    assert rows.tolist() == [3] and ids.tolist() == [1]


LOOP = """
.globl _start
.type _start, @function
_start:
    mov $5, %ecx
.type loop, @function
loop:
    dec %ecx
    jnz loop
    mov $60, %eax
    xor %edi, %edi
    syscall
.size loop, .-loop
.size _start, loop-_start
"""


def test_perf_reads_the_bts_perf_data(tmp_path):
    """A perf.data of BTS records for a real program's loop (its 4 taken
    jnz), laid out as ``perf record -e intel_bts//`` writes it: perf's own
    BTS decoder makes branch samples of them, named from the program's
    symbols, and hwtrace reads the same records back, and the loop branch
    as an event at a registered site."""
    from elftools.elf.elffile import ELFFile

    from hwtrace.perf.data import PerfData
    from hwtrace.perf.records import Comm, Mmap, SampleId
    from hwtrace.perf.writer import PerfDataWriter

    gcc, perf = shutil.which("gcc"), shutil.which("perf")
    if gcc is None:
        pytest.skip("gcc is not installed")
    (tmp_path / "loop.S").write_text(LOOP)
    exe = tmp_path / "loop"
    subprocess.run(
        [gcc, "-nostdlib", "-static", "-no-pie", "-o", str(exe), str(tmp_path / "loop.S")],
        check=True,
    )
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        loop = next(
            s["st_value"]
            for s in elf.get_section_by_name(".symtab").iter_symbols()
            if s.name == "loop"
        )
        seg = next(s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1)
        start, off, size = (
            seg["p_vaddr"] & ~0xFFF,
            seg["p_offset"] & ~0xFFF,
            seg["p_memsz"] + (seg["p_vaddr"] & 0xFFF),
        )
    jnz = loop + 2  # dec %ecx is 2 bytes
    path = tmp_path / "bts.data"
    with PerfDataWriter(path) as w:
        a = w.set_intel_bts()
        sid = SampleId(pid=42, tid=42, time=0)
        w.add_record(Comm(42, 42, "loop"), attr=a, sample_id=sid)
        w.add_record(
            Mmap(42, 42, start, (size + 0xFFF) & ~0xFFF, off, str(exe)),
            attr=a,
            misc=2,
            sample_id=sid,
        )
        # The AUX data's reference (perf's TSC when it read the buffer) after the sideband.
        w.add_auxtrace(
            encode_bts(np.full(4, jnz, np.uint64), np.full(4, loop, np.uint64)),
            tid=42,
            reference=1000,
        )
    mine = perf_bts(PerfData(str(path)))
    assert list(mine) == [42] and len(mine[42]) == 4 and set(mine[42].source.tolist()) == {jnz}
    rows, ids = events_at(mine[42], {jnz: 1})
    assert rows.tolist() == [0, 1, 2, 3] and ids.tolist() == [1, 1, 1, 1]
    # The command: branches named from the program, events at a site.
    listed = _bts("-i", str(path))
    assert listed.returncode == 0, listed.stderr
    assert (
        listed.stdout.splitlines()
        == [f"{'loop':>16} {42:>7}  {jnz:16x} loop+0x2 ({exe}) => {loop:16x} loop ({exe})"] * 4
    )
    got = _bts("-i", str(path), "--at", "loop+0x2=tick", "--json", str(tmp_path / "e.jsonl"))
    assert got.returncode == 0 and got.stderr == "hwtrace bts: tick: 4 events\n"
    rows = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [(r["event"], r["tid"], int(r["from"], 16)) for r in rows] == [("tick", 42, jnz)] * 4
    assert _bts("-i", str(path), "--at", "nosuch=x").returncode == 2
    got = _bts("-i", str(path), "--at", "loop+02=tick")  # (decimal: no octal, no traceback)
    assert got.returncode == 0 and got.stderr == "hwtrace bts: tick: 4 events\n"
    got = _bts("-i", str(path), "--at", "loop+2x=tick")
    assert got.returncode == 2 and "offset '2x' is not a number" in got.stderr
    if perf is None:
        pytest.skip("perf is not installed")
    out = subprocess.run(
        [perf, "script", "-i", str(path), "--itrace=b"], capture_output=True, text=True, check=True
    )
    lines = [ln for ln in out.stdout.splitlines() if "branches" in ln]
    # perf's decoder takes the first record as where the trace starts.
    assert len(lines) == 3 and "error" not in out.stderr
    assert all(f"{jnz:x} loop+0x2" in ln and f"{loop:x} loop+0x0" in ln for ln in lines)


def test_not_bts_is_one_message(tmp_path):
    from hwtrace.hwevents.bts import BtsError
    from hwtrace.perf.data import PerfData
    from hwtrace.perf.writer import PerfDataWriter

    with PerfDataWriter(tmp_path / "pt.data") as w:
        w.set_intel_pt()
    with pytest.raises(BtsError, match="no Intel BTS AUXTRACE_INFO"):
        perf_bts(PerfData(str(tmp_path / "pt.data")))
    got = _bts("-i", str(tmp_path / "pt.data"))
    assert got.returncode == 1 and got.stderr.count("\n") == 1 and "no Intel BTS" in got.stderr
    # (the file's name first: no offset, there is no BTS data to place it in)
    assert got.stderr.startswith(f"hwtrace bts: {tmp_path / 'pt.data'}: no Intel BTS")


def _bts(*args: str):
    import sys

    return subprocess.run([sys.executable, "-m", "hwtrace.cli.main", "bts", *args],
                          capture_output=True, text=True, check=False)  # fmt: skip
