"""``hwtrace filter`` reads a perf.data a range of records at a time: the
listing (in time order across ranges), the perf.data it writes, the counts
and the damage it reports are what the whole file read at once gives.
The input is written here: tracepoint samples of two formats (TRACING_DATA
embedded), COMM/FORK sideband, sample times out of order across flush
rounds, and records too short for their format."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import hwtrace.filter.inputs.perf as perf_input
from hwtrace.cli.main import main
from hwtrace.filter.apply import apply_filter
from hwtrace.filter.inputs import PerfSource
from hwtrace.filter.listing import render_listing
from hwtrace.perf.attr import PerfEventAttr
from hwtrace.perf.data import read_perf_data
from hwtrace.perf.features import Feature
from hwtrace.perf.records import Comm, Fork, SampleId
from hwtrace.perf.writer import PerfDataWriter

SWITCH = """name: sched_switch
ID: 316
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:28;\tsize:8;\tsigned:1;

print fmt: "prev_comm=%s", REC->prev_comm
"""
MSG = """name: msg
ID: 77
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;
\tfield:__data_loc char[] text;\toffset:16;\tsize:4;\tsigned:0;

print fmt: "id=%ld", REC->id
"""
HEADER_PAGE = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
HEADER_EVENT = "# compressed entry header\n\ttype_len    :    5 bits\n"
COMMS = ["bash", "nginx", "nginx-worker", "swapper/0"]
# IDENTIFIER IP TID TIME CPU PERIOD RAW
SAMPLE_TYPE = (1 << 16) | 1 | 2 | 4 | 128 | 256 | 1024


def _tracing_data() -> bytes:
    """perf's TRACING_DATA layout (tools/perf/util/trace-event-read.c)."""
    out = b"\x17\x08\x44tracing" + b"0.6\0" + bytes([0, 8]) + struct.pack("<I", 4096)
    out += b"header_page\0" + struct.pack("<Q", len(HEADER_PAGE)) + HEADER_PAGE.encode()
    out += b"header_event\0" + struct.pack("<Q", len(HEADER_EVENT)) + HEADER_EVENT.encode()
    out += struct.pack("<II", 0, 2)
    for system, fmt in (("sched", SWITCH), ("test", MSG)):
        out += system.encode() + b"\0" + struct.pack("<IQ", 1, len(fmt)) + fmt.encode()
    return out


def _sample(ident: int, pid: int, tid: int, time: int, cpu: int, raw: bytes) -> bytes:
    raw += bytes(-(4 + len(raw)) % 8)
    body = struct.pack("<QQIIQIIQ", ident, 0xFFFF0000 + tid, pid, tid, time, cpu, 0, 1)
    body += struct.pack("<I", len(raw)) + raw
    return struct.pack("<IHH", 9, 1, 8 + len(body)) + body


def _write(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = PerfDataWriter(path)
    attr = {"sample_period": 1, "sample_type": SAMPLE_TYPE, "sample_id_all": 1}
    sw = w.add_attr(PerfEventAttr(type=2, config=316, comm=1, task=1, **attr), name="sw")
    w.add_attr(PerfEventAttr(type=2, config=77, **attr), name="msg")
    w.set_feature(Feature.TRACING_DATA, _tracing_data())
    for k, c in enumerate(COMMS):
        sid = SampleId(pid=100 + k, tid=100 + k, time=10 + k, cpu=0)
        w.add_record(Comm(100 + k, 100 + k, c), attr=sw, sample_id=sid)
    w.add_record(Fork(101, 100, 150, 100, 50), attr=sw, sample_id=SampleId(time=50))
    t = 1_000_000_000
    for i in range(n):
        t += int(rng.integers(0, 3000))
        jitter = int(rng.integers(-6000, 6000)) if i % 7 == 0 else 0
        k = int(rng.integers(0, len(COMMS)))
        pid = 100 + k
        tid = 150 if k == 1 and i % 3 == 0 else pid
        if i % 3:
            rec = struct.pack(
                "<HBBi16siq", 316, 0, 0, tid, COMMS[k].encode()[:15], pid, int(rng.integers(0, 3))
            )
            ident = 1
        else:
            text = f"m{i}-".encode() + b"x" * int(rng.integers(0, 30)) + b"\0"
            rec = struct.pack("<HBBiqI", 77, 0, 0, tid, i - n // 2, 20 | len(text) << 16) + text
            if i % 97 == 0:
                rec = rec[:12]  # too short for its format
            ident = 2
        w.add_bytes(_sample(ident, pid, tid, t + jitter, int(rng.integers(0, 4)), rec))
        if i % 500 == 499:
            w.finished_round()
    w.close()


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chunks") / "in.data"
    _write(path, 3000, 7)
    return path


EXPRESSIONS = [
    'prev_comm == "ngin*" || id > 3',
    '$ctx.cpu_id == 2 && $ctx.procname == "nginx*"',
    'prev_state != 0 || text == "m1*"',
]


@pytest.mark.parametrize("expr", EXPRESSIONS)
@pytest.mark.parametrize("chunk", [61, 1000, 1 << 16])
def test_chunks_give_what_the_whole_file_gives(
    recording, tmp_path, capsysbinary, monkeypatch, expr, chunk
):
    source = PerfSource(str(recording))
    whole = apply_filter(source, expr)
    want_text = b"".join(render_listing(source, whole.keep))
    want_json = b"".join(render_listing(source, whole.keep, json=True))
    source.write_subset(str(tmp_path / "want.data"), whole.keep)
    monkeypatch.setattr(perf_input, "CHUNK_RECORDS", chunk)
    assert main(["filter", expr, str(recording)]) == 1  # the short records are damage
    out, err = capsysbinary.readouterr()
    assert out == want_text and out.count(b"\n") == int(whole.keep.sum())
    (warning,) = [line for line in err.decode().splitlines() if "warning" in line]
    assert warning.endswith(f"warning: {source.problems[0]}")
    assert "test:msg record(s) too short" in warning
    main(["filter", expr, str(recording), "-o", str(tmp_path / "got.jsonl")])
    assert (tmp_path / "got.jsonl").read_bytes() == want_json
    main(["filter", expr, str(recording), "-o", str(tmp_path / "got.data"), "--count"])
    out, _ = capsysbinary.readouterr()
    assert (tmp_path / "got.data").read_bytes() == (tmp_path / "want.data").read_bytes()
    rows = {line.split()[0]: line.split()[1:3] for line in out.decode().splitlines()[1:]}
    for r in whole:
        assert rows[r.type.name] == [str(len(r.type)), str(r.count)]
    got = read_perf_data(tmp_path / "got.data")
    assert not got.errors and len(got.samples()) == int(whole.keep.sum())


def test_listing_is_in_time_order_across_chunks(recording, capsysbinary, monkeypatch):
    monkeypatch.setattr(perf_input, "CHUNK_RECORDS", 50)
    main(["filter", "$ctx.tid > 0", str(recording)])
    out, _ = capsysbinary.readouterr()
    stamps = [float(line.split(b"]", 1)[1].split(b":")[0]) for line in out.splitlines()]
    assert len(stamps) > 2900 and stamps == sorted(stamps)
    # The samples are not in time order in the file.
    data = read_perf_data(recording)
    times = data.samples()["time"]
    assert (np.diff(times) < 0).any()
