"""perf.data bad input: one PerfDataError naming file and offset, or the
records around the damage kept and the damage listed; never a traceback."""

from __future__ import annotations

import functools
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.perf.attr import PerfEventAttr
from hwtrace.perf.data import PerfDataError, PerfDataWarning, read_perf_data
from hwtrace.perf.records import Comm, Mmap, RecordType, SampleId, SampleType
from hwtrace.perf.writer import PerfDataWriter


def sample_file(path: Path) -> bytes:
    """A small but varied perf.data: sideband, samples, PT, features."""
    w = PerfDataWriter(path, hostname="h")
    w.set_intel_pt(cap_user_time_zero=True, time_mult=5, per_cpu_mmaps=True)
    sw = w.add_attr(
        PerfEventAttr(type=1, sample_period=1000, sample_id_all=1,
                      sample_type=SampleType.IP | SampleType.TID | SampleType.TIME
                      | SampleType.IDENTIFIER | SampleType.CPU | SampleType.CALLCHAIN),
        ids=[100], name="cpu-clock",
    )  # fmt: skip
    sid = SampleId(pid=1, tid=2, time=10, cpu=0)
    for k in range(20):
        w.add_record(Comm(1, 2, f"c{k}"), attr=sw, sample_id=sid)
        w.add_record(Mmap(1, 2, 0x400000, 0x1000, 0, f"/bin/x{k}"), attr=sw, sample_id=sid)
        body = struct.pack("<QQIIQIIQQQ", 100, 0x401000 + k, 1, 2, 20 + k, 0, 0, 2, 7, 8)
        w.add_record(body, type=RecordType.SAMPLE)
        w.add_auxtrace(bytes([2, 0x82] * 8) + bytes(k), cpu=0, idx=0)
        w.finished_round()
    w.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return sample_file(tmp_path_factory.mktemp("bad") / "good.data")


def exercise(d) -> None:
    """Everything a user would touch."""
    d.samples()
    d.auxtrace()
    _ = d.intel_pt, d.time_conv
    for i in range(len(d)):
        try:
            if d.records["type"][i] < 64:
                d.record(i)
            else:
                d.user_record(i)
        except PerfDataError as e:
            assert e.offset >= 0 and e.path


def test_good_file_is_clean(good: bytes) -> None:
    d = read_perf_data(good, "good.data")
    assert not d.errors and len(d.gaps) == 0
    assert d.summary()["SAMPLE"] == 20 and d.summary()["AUXTRACE"] == 20
    assert len(d.samples()) == 20


def test_wrong_magic(good: bytes) -> None:
    with pytest.raises(PerfDataError) as e:
        read_perf_data(b"PERFFILX" + good[8:], "x.data")
    assert e.value.offset == 0 and "x.data" in str(e.value) and "magic" in str(e.value)


def test_a_stream_that_is_no_perf_data_is_not_read_to_its_end(good: bytes) -> None:
    """A pipe or device (``-i /dev/zero``, a mistaken pipe) is read to its
    end only once its first bytes are a perf.data magic: it was read whole
    first, 4 GB in six seconds of /dev/zero."""

    class Endless:
        name = "endless"

        def read(self, n: int = -1) -> bytes:
            assert n >= 0, "read to the end"
            return b"\0" * n

    with pytest.raises(PerfDataError, match="magic"):
        read_perf_data(Endless())
    with pytest.raises(PerfDataError, match="magic") as e:
        read_perf_data("/dev/zero")
    assert e.value.offset == 0 and "/dev/zero" in str(e.value)

    class Piped:
        name = "piped"

        def __init__(self) -> None:
            self.at = 0

        def read(self, n: int = -1) -> bytes:
            # (a byte at a time, as a raw pipe may give them)
            got = good[self.at :] if n < 0 else good[self.at : self.at + min(n, 1)]
            self.at += len(got)
            return got

    assert read_perf_data(Piped()).summary() == read_perf_data(good).summary()


@pytest.mark.parametrize("n", [0, 7, 15, 50, 103])
def test_truncated_header(good: bytes, n: int) -> None:
    with pytest.raises(PerfDataError) as e:
        read_perf_data(good[:n], "t.data")
    assert "t.data" in str(e.value)


def test_truncated_file_keeps_what_it_can(good: bytes) -> None:
    d0 = read_perf_data(good)
    data_end = d0.header.data_offset + d0.header.data_size
    cut = int(d0.records["offset"][len(d0) // 2]) + 20
    d = read_perf_data(good[:cut], "cut.data")
    assert d.errors and all("cut.data" in str(e) for e in d.errors)
    assert any(e.offset == 48 for e in d.errors)  # the data section's size field
    assert 0 < len(d) < len(d0)
    np.testing.assert_array_equal(d.records["offset"], d0.records["offset"][: len(d)])
    assert data_end > cut
    exercise(d)


def test_attrs_beyond_the_file(good: bytes) -> None:
    bad = bytearray(good)
    struct.pack_into("<Q", bad, 24, len(good) + 8)  # attrs.offset
    with pytest.raises(PerfDataError) as e:
        read_perf_data(bytes(bad), "a.data")
    assert e.value.offset == 24 and "beyond the file" in str(e.value)


def test_feature_section_beyond_the_file(good: bytes) -> None:
    d0 = read_perf_data(good)
    at = d0.header.data_offset + d0.header.data_size  # the first feature's section
    bad = bytearray(good)
    struct.pack_into("<Q", bad, at, 1 << 40)
    d = read_perf_data(bytes(bad), "f.data")
    assert [e.offset for e in d.errors] == [at]
    assert len(d) == len(d0)


@pytest.mark.parametrize("size", [0, 4])
def test_impossible_record_size_resynchronises(good: bytes, size: int) -> None:
    d0 = read_perf_data(good)
    k = 10
    at = int(d0.records["offset"][k])
    bad = bytearray(good)
    struct.pack_into("<H", bad, at + 6, size)
    d = read_perf_data(bytes(bad), "s.data")
    assert len(d.gaps) == 1 and int(d.gaps[0, 0]) == at
    assert d.errors[0].offset == at and "impossible record size" in str(d.errors[0])
    # everything before and after the damaged record is kept
    kept = set(d.records["offset"].tolist())
    want = set(d0.records["offset"].tolist()) - {at}
    assert kept == want
    exercise(d)


def test_zeroed_region(good: bytes) -> None:
    d0 = read_perf_data(good)
    a, b = int(d0.records["offset"][30]), int(d0.records["offset"][40])
    bad = bytearray(good)
    bad[a:b] = bytes(b - a)
    d = read_perf_data(bytes(bad), "z.data")
    assert len(d.gaps) == 1 and int(d.gaps[0, 0]) == a and int(d.gaps[0, 1]) == b - a
    assert set(d.records["offset"].tolist()) == set(d0.records["offset"].tolist()) - set(
        d0.records["offset"][30:40].tolist()
    )
    exercise(d)


def test_unknown_record_type_warns_once(good: bytes) -> None:
    d0 = read_perf_data(good)
    bad = bytearray(good)
    rows = d0.where(RecordType.FINISHED_ROUND)
    for r in rows[:3]:
        struct.pack_into("<I", bad, int(d0.records["offset"][r]), 99)
    with pytest.warns(PerfDataWarning, match="3 record.*unknown type 99") as rec:
        d = read_perf_data(bytes(bad))
    assert len([w for w in rec if issubclass(w.category, PerfDataWarning)]) == 1
    assert len(d) == len(d0) and not d.errors
    exercise(d)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PerfDataError) as e:
        read_perf_data(tmp_path / "nope.data")
    assert "nope.data" in str(e.value)


def mutate(good: bytes, data: st.DataObject) -> bytes:
    buf = bytearray(good)
    for _ in range(data.draw(st.integers(1, 8), label="mutations")):
        kind = data.draw(st.sampled_from(["byte", "word", "zero", "cut"]))
        at = data.draw(st.integers(0, len(buf) - 1))
        if kind == "byte":
            buf[at] = data.draw(st.integers(0, 255))
        elif kind == "word":
            v = data.draw(st.sampled_from([0, 1, 7, 8, 0xFFFF, 0xFFFFFFFF, 1 << 40, (1 << 64) - 1]))
            at -= at % 8
            if at + 8 <= len(buf):
                struct.pack_into("<Q", buf, at, v)
        elif kind == "zero":
            n = data.draw(st.integers(1, 256))
            buf[at : at + n] = bytes(len(buf[at : at + n]))
        else:
            del buf[max(at, 1) :]
    return bytes(buf)


def check_mutant(buf: bytes) -> None:
    """Either one PerfDataError with an offset, or a reader whose every
    accessor works (errors listed as PerfDataError with offsets)."""
    try:
        d = read_perf_data(buf, "fuzz.data")
    except PerfDataError as e:
        assert e.offset >= 0 and "fuzz.data" in str(e)
        return
    for e in d.errors:
        assert isinstance(e, PerfDataError) and e.offset >= 0
    exercise(d)


@functools.cache
def hwtrace_written() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        return sample_file(Path(d) / "good.data")


@functools.cache
def perf_recorded() -> tuple[bytes, ...]:
    """perf record's own files, file and pipe mode (empty without perf)."""
    perf = shutil.which("perf")
    if perf is None:
        return ()
    out = []
    with tempfile.TemporaryDirectory() as d:
        for target in (str(Path(d) / "f.data"), "-"):
            r = subprocess.run(
                [perf, "record", "-q", "-o", target, "-e", "cpu-clock", "-c", "50000",
                 "--switch-events", "--", "sh", "-c", "for i in $(seq 1 200); do :; done"],
                capture_output=True, check=True,
            )  # fmt: skip
            out.append(Path(target).read_bytes() if target != "-" else r.stdout)
    return tuple(out)


FUZZ = settings(max_examples=300, deadline=None)


@pytest.mark.filterwarnings("ignore::hwtrace.perf.data.PerfDataWarning")
@FUZZ
@given(data=st.data())
def test_fuzz_hwtrace_written(data: st.DataObject) -> None:
    """Mutated hwtrace-written files (Intel PT, AUXTRACE payloads, samples)."""
    check_mutant(mutate(hwtrace_written(), data))


@pytest.mark.skipif(shutil.which("perf") is None, reason="Linux perf is not installed")
@pytest.mark.filterwarnings("ignore::hwtrace.perf.data.PerfDataWarning")
@FUZZ
@given(data=st.data())
def test_fuzz_perf_recorded(data: st.DataObject) -> None:
    """Mutated files of perf record itself (file and pipe mode)."""
    check_mutant(mutate(data.draw(st.sampled_from(perf_recorded())), data))


@pytest.mark.filterwarnings("ignore::hwtrace.perf.data.PerfDataWarning")
@FUZZ
@given(data=st.data())
def test_fuzz_compressed(data: st.DataObject) -> None:
    """Mutated ``perf record -z`` files (perf's own, checked in): their
    COMPRESSED records' zstd stream damaged too."""
    from hwtrace.perf.zstd import zstd_available

    if not zstd_available():
        pytest.skip("libzstd is not installed")
    good = (Path(__file__).resolve().parents[1] / "data" / "perf-zstd-cpu-clock.data").read_bytes()
    check_mutant(mutate(good, data))


def test_perf_dump_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hwtrace.cli.main import main

    path = tmp_path / "good.data"
    path.write_bytes(hwtrace_written())
    assert main(["perf-dump", str(path)]) == 0
    out = capsys.readouterr().out
    assert "AUXTRACE_INFO" in out and "SAMPLE time=" in out and "ip=0x401000" in out
    assert "# hostname : h\n" in out
    bad = bytearray(hwtrace_written())
    d = read_perf_data(bytes(bad))
    struct.pack_into("<H", bad, int(d.records["offset"][5]) + 6, 0)
    path.write_bytes(bytes(bad))
    assert main(["perf-dump", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"offset {int(d.records['offset'][5]):#x}: impossible record size" in err
    path.write_bytes(b"PERFILEX" + bytes(200))
    assert main(["perf-dump", str(path)]) == 1
    assert "magic" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("perf") is None, reason="Linux perf is not installed")
def test_perf_dump_header_is_perf_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """perf-dump prints a header's features as ``perf report --header-only
    -I`` does (the features perf prints the same way on a file of its own,
    with a clock and compression), and records as text: no Python reprs."""
    perf = shutil.which("perf")
    path = tmp_path / "perf.data"
    cmd = [perf, "record", "-q", "-o", str(path), "-e", "cpu-clock", "-k", "mono", "-z", "true"]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        cmd.remove("-z")  # (a perf built without zstd)
        subprocess.run(cmd, capture_output=True, check=True)
    hidden = ("captured on", "header version", "data offset", "data size", "feat offset",
              "missing features", "========")  # fmt: skip
    perf_lines = [
        line
        for line in subprocess.run(
            [perf, "report", "-i", str(path), "--header-only", "-I"],
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()
        if line.startswith("# ") and not line[2:].startswith(hidden)
    ]  # fmt: skip
    from hwtrace.cli.main import main

    assert main(["perf-dump", str(path)]) == 0
    out = capsys.readouterr().out
    ours = [line for line in out.splitlines() if line.startswith("# ")]
    # (perf-dump's own lines: the file's layout, its attrs, the build IDs)
    ours = [line for line in ours
            if not re.match(r"# (file mode|data offset|event \d+:|build id)", line)]  # fmt: skip
    assert "# pmu mappings: " + "software = 1" in " ".join(perf_lines)
    assert ours == perf_lines
    records = [line for line in out.splitlines() if not line.startswith("#")]
    assert any(": COMM " in line and " comm=" in line for line in records)
    for line in records:
        assert "(" not in line.split(": ", 1)[1] and "b'" not in line, line


def test_file_cut_inside_its_last_trace_keeps_that_trace(good: bytes) -> None:
    """perf killed, a disk full: the file ends inside an AUXTRACE record's
    trace.  The record is kept with the bytes it has, what is missing is
    reported at the record, and the records before it are all there."""
    d0 = read_perf_data(good)
    aux0 = d0.auxtrace_columns()
    last = int(aux0["data_offset"][-1])
    cut = last + int(aux0["size"][-1]) // 2
    d = read_perf_data(good[:cut], "cut.data")
    aux = d.auxtrace_columns()
    assert len(aux["size"]) == len(aux0["size"])
    np.testing.assert_array_equal(aux["size"][:-1], aux0["size"][:-1])
    assert int(aux["size"][-1]) == cut - last
    missing = int(aux0["size"][-1]) - (cut - last)
    at = int(d0.records["offset"][aux0["row"][-1]])
    assert any(e.offset == at and f"cut short by the end of the data: {missing} bytes missing"
               in str(e) for e in d.errors)  # fmt: skip
    assert bytes(d.auxtrace()[-1].data) == good[last:cut]
    exercise(d)
