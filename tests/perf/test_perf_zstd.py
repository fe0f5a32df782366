"""perf.data with compressed records (``perf record -z``): the records of
perf's zstd stream read as perf reads them, and written so perf reads them.

``tests/data/perf-zstd-cpu-clock.data`` was recorded here by perf 6.1
(``perf record -z -e cpu-clock -- sh -c 'ls -R /usr/share/doc > /dev/null;
ls /usr/lib > /dev/null'``); ``perf-zstd-cpu-clock.script`` is ``perf script
-F tid,time,ip --ns`` of it.
"""

from __future__ import annotations

import collections
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hwtrace.cli.main import main
from hwtrace.perf.data import read_perf_data
from hwtrace.perf.features import Feature
from hwtrace.perf.records import Comm, RecordType, SampleId
from hwtrace.perf.writer import PerfDataWriter
from hwtrace.perf.zstd import zstd_available

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED = DATA / "perf-zstd-cpu-clock.data"

pytestmark = pytest.mark.skipif(not zstd_available(), reason="libzstd is not installed")

# perf report --stats of the recording (perf 6.1): the records inside the
# COMPRESSED ones counted too.
PERF_STATS = {
    "MMAP": 1, "COMM": 4, "EXIT": 3, "FORK": 2, "SAMPLE": 44, "MMAP2": 16, "FINISHED_ROUND": 1,
    "ID_INDEX": 1, "THREAD_MAP": 1, "CPU_MAP": 1, "EVENT_UPDATE": 2, "COMPRESSED": 2,
    "FINISHED_INIT": 1,
}  # fmt: skip


def _counts(path: Path) -> dict[str, int]:
    data = read_perf_data(path)
    assert not data.errors
    return dict(collections.Counter(RecordType(int(t)).name for t in data.records["type"]))


def test_records_are_perfs():
    assert _counts(RECORDED) == PERF_STATS
    if shutil.which("perf") is not None:
        got = subprocess.run(["perf", "report", "--stats", "-i", str(RECORDED)],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        stats = dict(re.findall(r"^\s*(\w+) events:\s+(\d+)", got.stdout, re.M))
        stats.pop("TOTAL", None)
        assert {k: int(v) for k, v in stats.items()} == PERF_STATS


def test_samples_are_perfs():
    """The samples, decoded from the decompressed records, as perf script
    lists them (tid, time, ip)."""
    data = read_perf_data(RECORDED)
    s = data.samples()
    mine = [f"{t} {ns // 10**9}.{ns % 10**9:09d}: {ip:x}"
            for t, ns, ip in zip(s["tid"].tolist(), s["time"].tolist(), s["ip"].tolist(),
                                 strict=True)]  # fmt: skip
    theirs = [" ".join(line.split()) for line in (DATA / "perf-zstd-cpu-clock.script")
              .read_text().splitlines()]  # fmt: skip
    assert mine == theirs


def test_processes_come_from_the_compressed_records():
    """The sideband inside the COMPRESSED records (the commands run, their
    mappings) is the recording's, each record after the COMPRESSED record
    that held it."""
    data = read_perf_data(RECORDED)
    r = data.records
    assert data.decompressed_at is not None
    inside = r["offset"] >= data.decompressed_at
    comms = [data.record(i).body.comm for i in np.flatnonzero(r["type"] == RecordType.COMM)]
    assert {"sh", "ls"} <= set(comms)
    first_inside = int(np.flatnonzero(inside)[0])
    assert r["type"][first_inside - 1] == RecordType.COMPRESSED


def test_damaged_stream_is_one_error(tmp_path):
    """A COMPRESSED record whose bytes are not zstd's: an error naming its
    offset, every other record kept."""
    raw = bytearray(RECORDED.read_bytes())
    data = read_perf_data(RECORDED)
    r = data.records
    first = int(r["offset"][np.flatnonzero(r["type"] == RecordType.COMPRESSED)[0]])
    raw[first + 8 : first + 16] = b"\xff" * 8
    bad = tmp_path / "bad.data"
    bad.write_bytes(bytes(raw))
    damaged = read_perf_data(bad)
    assert len(damaged.errors) == 1
    assert f"{first:#x}" in str(damaged.errors[0]) and "COMPRESSED" in str(damaged.errors[0])
    assert (damaged.records["type"] == RecordType.AUXTRACE).sum() == 0
    assert (damaged.records["type"] == RecordType.FINISHED_ROUND).sum() == 1
    assert main(["perf-dump", str(bad)]) in (0, 1)


def test_record_beyond_perfs_buffer_is_one_error(tmp_path):
    """A COMPRESSED record that decompresses to more than the buffer perf
    reads it into (the header's mmap_len): an error naming its offset and
    the bound, not memory without end; the records before it kept."""
    raw = bytearray(RECORDED.read_bytes())
    data = read_perf_data(RECORDED)
    value = data.features[Feature.COMPRESSED]
    packed = struct.pack("<IIIII", *value.values())
    assert raw.count(packed) == 1
    at = raw.index(packed)
    raw[at + 16 : at + 20] = struct.pack("<I", 1024)  # mmap_len (the records: 4,056 bytes)
    r = data.records
    first = int(r["offset"][np.flatnonzero(r["type"] == RecordType.COMPRESSED)[0]])
    small = tmp_path / "small.data"
    small.write_bytes(bytes(raw))
    got = read_perf_data(small)
    assert len(got.errors) == 1
    message = str(got.errors[0])
    assert f"{first:#x}" in message and "more than 1,024 bytes" in message, message
    assert not (got.records["type"] == RecordType.SAMPLE).any()
    assert main(["perf-dump", str(small)]) in (0, 1)


def _comms(w: PerfDataWriter, n: int, names: int, aux=None) -> None:
    """An Intel PT perf.data's ``n`` COMMs (``names`` distinct), with an
    AUXTRACE of ``aux(k)`` every 500th."""
    w.set_intel_pt(sample_type=0x10003 | 0x4)
    for k in range(n):
        w.add_record(Comm(pid=k, tid=k, comm=f"task-{k % names}"), attr=0,
                     sample_id=SampleId(pid=k, tid=k, time=1000 + k))  # fmt: skip
        if aux is not None and k % 500 == 0:
            w.add_auxtrace(aux(k))


def test_written_compressed_reads_back(tmp_path):
    """PerfDataWriter(compress=N) keeps kernel records in COMPRESSED ones;
    read back they are the records written."""
    paths = {}
    for level in (0, 3):
        paths[level] = path = tmp_path / f"z{level}.data"
        with PerfDataWriter(path, compress=level) as w:
            _comms(w, 3000, 7)
            w.finished_round()
            w.add_auxtrace(b"\x02\x82" * 8)
    plain, packed = read_perf_data(paths[0]), read_perf_data(paths[3])
    assert not packed.errors
    assert (packed.records["type"] == RecordType.COMPRESSED).sum() >= 2  # one stream, several
    keep = packed.records["type"] != RecordType.COMPRESSED
    for col in ("type", "size", "time", "pid", "tid"):
        assert np.array_equal(packed.records[col][keep], plain.records[col]), col
    comms = np.flatnonzero(packed.records["type"] == RecordType.COMM)
    assert packed.record(int(comms[-1])).body.comm == f"task-{2999 % 7}"
    if shutil.which("perf") is not None:
        got = subprocess.run(["perf", "report", "--stats", "-i", str(paths[3])],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert re.search(r"COMM events:\s+3000\b", got.stdout), got.stdout + got.stderr


def test_subset_of_a_compressed_recording(tmp_path):
    """A copy of a compressed recording without some samples (``hwtrace
    filter -o``): its records written decompressed, the COMPRESSED ones
    not, the AUXTRACE index moved to where its records went."""
    from hwtrace.perf.features import Feature
    from hwtrace.perf.rewrite import write_subset

    src = tmp_path / "z.data"
    with PerfDataWriter(src, compress=1) as w:
        _comms(w, 2000, 5, lambda k: bytes([0x02, 0x82]) * 8 + bytes([k % 256]) * 16)
    data = read_perf_data(src)
    r = data.records
    comms = np.flatnonzero(r["type"] == RecordType.COMM)
    out = tmp_path / "subset.data"
    write_subset(data, out, comms[::2])
    got = read_perf_data(out)
    assert not got.errors
    kept = r["type"][np.setdiff1d(np.arange(len(r["type"])), comms[::2])]
    assert np.array_equal(got.records["type"], kept[kept != RecordType.COMPRESSED])
    aux = got.auxtrace_columns()
    index = [o for o, _ in got.features[Feature.AUXTRACE]]
    assert index == got.records["offset"][aux["row"]].tolist()
    tails = [bytes(got.buf[o : o + 32])[-1] for o in aux["data_offset"].tolist()]
    assert tails == [0, 244, 232, 220]


def test_released_pages_come_back_and_the_decompressed_stay(tmp_path):
    """A compressed recording's buffer is the file's mapping and the
    decompressed records after it: letting pages go (as decoding a large
    trace does) drops the file's, which read back the same, and never
    the decompressed records (here 33 pages of them)."""
    from hwtrace.pt.packets import is_mapped, release

    path = tmp_path / "z.data"
    with PerfDataWriter(path, compress=1) as w:
        _comms(w, 3000, 7)
        w.add_auxtrace(b"\x02\x82" * 4096)
    data = read_perf_data(path)
    buf = data.buf
    assert is_mapped(buf) and buf.shape[0] - data.decompressed_at > 32 * 4096
    before = bytes(buf)
    release(buf, 0, buf.shape[0])
    release(buf[100:], 0, buf.shape[0] - 100)
    assert bytes(buf) == before
    comms = np.flatnonzero(data.records["type"] == RecordType.COMM)
    assert data.record(int(comms[-1])).body.comm == f"task-{2999 % 7}"
