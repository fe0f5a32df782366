"""Filtered copies of a perf.data (hwtrace.perf.rewrite.write_subset)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from hwtrace.perf.attr import PerfEventAttr
from hwtrace.perf.data import PerfDataError, read_perf_data
from hwtrace.perf.features import Feature
from hwtrace.perf.records import Comm, RecordType, SampleId, SampleType
from hwtrace.perf.rewrite import SubsetWriter, write_subset
from hwtrace.perf.user import pack_header_attr
from hwtrace.perf.writer import PerfDataWriter

ST = SampleType.IDENTIFIER | SampleType.IP | SampleType.TID | SampleType.TIME


def _sample(ident: int, tid: int, time: int, extra: int = 0) -> bytes:
    body = struct.pack("<QQIIQ", ident, 0x401000 + tid, tid, tid, time) + bytes(8 * extra)
    return struct.pack("<IHH", RecordType.SAMPLE, 2, 8 + len(body)) + body


def _file(path: Path, n: int = 300) -> None:
    """Samples of two events, COMMs and AUXTRACE records (one larger than
    the tests' copy buffer) interleaved."""
    w = PerfDataWriter(path)
    a = w.add_attr(PerfEventAttr(type=1, sample_type=int(ST), sample_id_all=1, comm=1), name="a")
    w.add_attr(PerfEventAttr(type=1, config=1, sample_type=int(ST), sample_id_all=1), name="b")
    for i in range(n):
        w.add_bytes(_sample(1 + i % 2, 10 + i % 5, 1000 + i, extra=i % 3))
        if i % 50 == 7:
            w.add_record(Comm(10, 10, f"c{i}"), attr=a, sample_id=SampleId(pid=10, tid=10, time=i))
        if i % 97 == 3:
            w.add_auxtrace(bytes([i % 251]) * (5000 if i == 100 else 40), cpu=0, idx=0)
    w.close()


def _expected(data, drop: np.ndarray) -> list[bytes]:
    r = data.records
    keep = np.ones(len(data), bool)
    keep[drop] = False
    return [
        bytes(data.buf[o : o + s + p])
        for o, s, p in zip(r["offset"][keep], r["size"][keep], r["payload"][keep], strict=True)
    ]


def _records(data) -> list[bytes]:
    return _expected(data, np.zeros(0, np.int64))


@pytest.mark.parametrize(("chunk_bytes", "chunk_rows"), [(1 << 23, 1 << 16), (256, 7)])
def test_subset_keeps_every_other_record_and_the_index(tmp_path, chunk_bytes, chunk_rows):
    src = tmp_path / "in.data"
    _file(src)
    data = read_perf_data(src)
    samples = data.where(RecordType.SAMPLE)
    drop = samples[(samples % 3 == 0) | (samples > len(data) - 20)]
    out = tmp_path / "out.data"
    n, size = write_subset(data, out, drop, chunk_bytes=chunk_bytes, chunk_rows=chunk_rows)
    got = read_perf_data(out)
    assert not got.errors
    assert _records(got) == _expected(data, drop)
    assert n == len(data) - drop.shape[0] and size == got.header.data_size
    assert [a.attr for a in got.attrs] == [a.attr for a in data.attrs]
    assert set(got.raw_features) == set(data.raw_features)
    for feat, raw in data.raw_features.items():
        if feat != Feature.AUXTRACE:
            assert got.raw_features[feat] == raw
    # The AUXTRACE index names the AUXTRACE records at their new offsets.
    index = [o for o, _ in got.features[Feature.AUXTRACE]]
    assert index == got.records["offset"][got.where(RecordType.AUXTRACE)].tolist()
    assert [bytes(a.data) for a in got.auxtrace()] == [bytes(a.data) for a in data.auxtrace()]


def test_subset_of_nothing_dropped_is_the_same_file(tmp_path):
    src = tmp_path / "in.data"
    _file(src, 60)
    out = tmp_path / "out.data"
    write_subset(read_perf_data(src), out, np.zeros(0, np.int64))
    assert out.read_bytes() == src.read_bytes()


def test_pipe_mode_subset(tmp_path):
    attr = PerfEventAttr(type=1, sample_type=int(ST), sample_id_all=1)
    records = [pack_header_attr(attr, [1])] + [_sample(1, 7, 100 + i) for i in range(20)]
    pipe = b"PERFILE2" + struct.pack("<Q", 16) + b"".join(records)
    data = read_perf_data(pipe)
    assert data.pipe
    drop = data.where(RecordType.SAMPLE)[::2]
    out = tmp_path / "out.data"
    write_subset(data, out, drop)
    got = read_perf_data(out)
    assert got.pipe and _records(got) == _expected(data, drop)


def test_unsupported_layout_is_one_error(tmp_path):
    src = tmp_path / "in.data"
    _file(src, 10)
    data = read_perf_data(src)
    data.header.attrs_offset = data.header.data_offset + 8  # as if after the data
    with pytest.raises(PerfDataError, match="attrs after the data section") as e:
        write_subset(data, tmp_path / "out.data", np.zeros(0, np.int64))
    assert e.value.offset == 24


def test_subset_given_in_ranges_is_the_same_file(tmp_path):
    src = tmp_path / "in.data"
    _file(src)
    data = read_perf_data(src)
    samples = data.where(RecordType.SAMPLE)
    drop = samples[samples % 4 == 1]
    write_subset(data, tmp_path / "whole.data", drop)
    with SubsetWriter(data, tmp_path / "ranges.data", chunk_bytes=512) as w:
        for stop in (0, 5, 6, 90, 200):
            w.add(stop, drop[(drop >= w.next) & (drop < stop)])
    # The records after the last range are kept.
    kept = drop[drop < 200]
    write_subset(data, tmp_path / "want.data", kept)
    assert (tmp_path / "ranges.data").read_bytes() == (tmp_path / "want.data").read_bytes()
    assert (tmp_path / "whole.data").read_bytes() != (tmp_path / "want.data").read_bytes()
