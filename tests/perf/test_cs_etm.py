"""CoreSight ETM perf.data (``perf record -e cs_etm//``): hwtrace writes
one with PerfDataWriter.set_cs_etm, and Linux perf (linked with OpenCSD)
dumps the same packets as ``hwtrace csdump -i`` lists, per AUX buffer
fragment and trace ID; the trace-ons at a registered address come out as
events with their timestamps; every register written reads back; a
damaged AUXTRACE_INFO is one message naming its offset."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from cs_traces import one_point_trace

from hwtrace.hwevents.csframes import format_frames
from hwtrace.hwevents.etm4 import Etm4Config, Etm4Kind, Etm4Packet, encode_etm4
from hwtrace.perf.cs_etm import (
    AUX_FLAG_CORESIGHT_FORMAT_RAW,
    MAGIC,
    CsEtmCpu,
    CsEtmError,
    cs_etm_buffers,
    cs_etm_info,
    cs_etm_streams,
)
from hwtrace.perf.data import PerfData
from hwtrace.perf.records import Aux, Comm, SampleId
from hwtrace.perf.writer import PerfDataWriter

K, P = Etm4Kind, Etm4Packet
FOO = 0xFFFF_0000_0040_1000
ETM0 = Etm4Config(trace_id=0x10)
ETM1 = Etm4Config(trace_id=0x12, cycle_counting=True)
ETE2 = Etm4Config(ete=True, arch_major=5, arch_minor=0, trace_id=0x14)
PKT = re.compile(r"^\tIdx:\d+; ID:[0-9a-f]+;\t")


def _trace(cfg: Etm4Config, rng, n: int, t0: int) -> tuple[bytes, list[int], int]:
    """A stream from sync: n trace-ons at FOO between trace-ons elsewhere."""
    pk, times, t = one_point_trace(cfg, n, rng, foo=FOO, t0=t0, atoms=9, context=42)
    return encode_etm4(pk, cfg), times, t


def _interleave(rng, parts: list[tuple[int, bytes]]) -> bytes:
    """Formatter frames mixing the sources in random-sized chunks."""
    chunks, pos = [], [0] * len(parts)
    while any(p < len(d) for p, (_, d) in zip(pos, parts, strict=True)):
        for k, (tid, d) in enumerate(parts):
            n = int(rng.integers(1, 30))
            chunks.append((tid, d[pos[k] : pos[k] + n]))
            pos[k] += n
    return format_frames(chunks)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """CPU 0 (ETMv4): two AUXTRACE records, one AUX record each.  CPU 1
    (ETMv4, cycle counts): one AUXTRACE of two AUX fragments, the second
    mixing its trace with CPU 2's (a shared sink).  CPU 2 (ETE): one
    AUXTRACE.  Returns the path and the trace-on times per trace ID."""
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("cs_etm") / "perf.data"
    want: dict[int, list[int]] = {0x10: [], 0x12: [], 0x14: []}
    with PerfDataWriter(path, arch="aarch64", cpuid="0x00000000410fd0c0") as w:
        a = w.set_cs_etm([ETM0, ETM1, ETE2])
        w.add_record(
            Comm(42, 42, "prog"), attr=a, sample_id=SampleId(pid=42, tid=42, time=1, cpu=0)
        )
        time = [10]

        def aux(cpu: int, off: int, size: int, flags: int = 0) -> None:
            time[0] += 1
            sid = SampleId(pid=42, tid=42, time=time[0], cpu=cpu)
            w.add_record(Aux(off, size, flags), attr=a, sample_id=sid)

        t = 1000
        off0 = 0
        for _ in range(2):
            data, times, t = _trace(ETM0, rng, 12, t)
            want[0x10] += times
            fr = format_frames([(0x10, data)])
            aux(0, off0, len(fr))
            w.add_auxtrace(fr, cpu=0, idx=0, offset=off0, reference=100 + off0)
            off0 += len(fr)
        d1, times, t = _trace(ETM1, rng, 10, t)
        want[0x12] += times
        first = format_frames([(0x12, d1)])
        d1b, times1, t = _trace(ETM1, rng, 10, t)
        d2, times2, t = _trace(ETE2, rng, 10, t)
        want[0x12] += times1
        want[0x14] += times2
        second = _interleave(rng, [(0x12, d1b), (0x14, d2)])
        aux(1, 0, len(first))
        aux(1, len(first), len(second))
        w.add_auxtrace(first + second, cpu=1, idx=1, reference=500)
        d2b, times, t = _trace(ETE2, rng, 8, t)
        want[0x14] += times
        fr = format_frames([(0x14, d2b)])
        aux(2, 0, len(fr))
        w.add_auxtrace(fr, cpu=2, idx=2, reference=600)
    return path, want


def _perf_packets(path) -> list[str]:
    """The packet lines of ``perf report -D`` (skips without perf/OpenCSD)."""
    perf = shutil.which("perf")
    if perf is None:
        pytest.skip("perf is not installed")
    r = subprocess.run([perf, "report", "-D", "-i", str(path)], capture_output=True, text=True)
    if "OpenCSD is not linked" in r.stderr + r.stdout:
        pytest.skip("perf is not built with CoreSight (OpenCSD) support")
    assert r.returncode == 0, r.stderr
    assert "Unrecognised magic" not in r.stderr and "Couldn't find" not in r.stderr
    lines = [ln[1:] for ln in r.stdout.splitlines() if PKT.match(ln)]
    if not lines:
        pytest.skip("this perf does not dump CoreSight packets")
    return lines


def _by_id(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ln in lines:
        out.setdefault(ln.split(";")[1], []).append(ln)
    return out


def _csdump(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hwtrace.cli.main", "csdump", *args], capture_output=True, text=True
    )


def test_perf_dumps_the_same_packets(recording):
    path, _ = recording
    mine = _csdump("-i", str(path))
    assert mine.returncode == 0 and mine.stderr == ""
    ours = mine.stdout.splitlines()
    theirs = _perf_packets(path)
    # every fragment, every trace ID: the same packets at the same indices
    assert len(ours) > 300
    assert {ln.split(";")[1] for ln in ours} == {" ID:10", " ID:12", " ID:14"}
    # perf lists a packet when it ends, so sources sharing frames interleave
    # differently; per trace ID the sequences (fragments in file order) agree
    assert _by_id(ours) == _by_id(theirs)
    # perf script reads the file without complaint
    r = subprocess.run(
        [shutil.which("perf"), "script", "-i", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 0 and "rror" not in r.stderr, r.stderr


def test_events_at_the_registered_address(recording, tmp_path):
    path, want = recording
    out = tmp_path / "ev.json"
    r = _csdump("-i", str(path), "--events", "--at", f"{FOO:#x}=foo", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    got: dict[int, list[int]] = {0x10: [], 0x12: [], 0x14: []}
    for row in rows:
        assert row["event"] == "foo" and row["address"] == f"{FOO:#x}" and row["context"] == "0x2a"
        got[int(row["source"].split(" ID ")[1].split()[0], 16)].append(row["ts"])
    assert got == want
    assert len(r.stdout.splitlines()) == sum(len(v) for v in want.values())


def test_buffers_and_streams(recording):
    path, _ = recording
    data = PerfData(str(path))
    info = cs_etm_info(data)
    assert (info.version, info.pmu_type, info.snapshot) == (1, 10, False)
    assert [(c.cpu, c.kind, c.trace_id) for c in info.cpus] == [
        (0, "ETMv4", 0x10), (1, "ETMv4", 0x12), (2, "ETE", 0x14)
    ]  # fmt: skip
    for c, cfg in zip(info.cpus, (ETM0, ETM1, ETE2), strict=True):
        assert c.config == cfg
    bufs = cs_etm_buffers(data, info)
    assert [(b.cpu, b.aux_offset, sorted(b.streams)) for b in bufs] == [
        (0, 0, [0x10]), (0, bufs[1].aux_offset, [0x10]), (1, 0, [0x12]),
        (1, bufs[3].aux_offset, [0x12, 0x14]), (2, 0, [0x14]),
    ]  # fmt: skip
    assert all(b.formatted and not b.errors for b in bufs)
    # byte file offsets point at the payload bytes they came from (an even
    # frame byte's bit 0 is in the frame's last byte)
    b = bufs[3]
    for t, s in b.streams.items():
        assert np.array_equal(
            data.buf[np.asarray(b.offsets[t])] >> 1, np.frombuffer(s, np.uint8) >> 1
        )
    streams = cs_etm_streams(data, info)
    assert [(s.cpu, s.trace_id) for s in streams] == [(0, 0x10), (1, 0x12), (1, 0x14), (2, 0x14)]
    assert streams[0].starts.tolist() == [0, len(bufs[0].streams[0x10])]


def test_unformatted_trbe_trace(tmp_path):
    """TRBE: AUX records flagged CORESIGHT_FORMAT_RAW, each buffer one
    CPU's ETE bytes.  perf 6.1 decodes every unformatted queue with the
    first CPU block's parameters (its ID); hwtrace with the buffer's CPU's:
    the packets agree but for the ID when the CPUs' configurations match."""
    rng = np.random.default_rng(5)
    cfgs = [Etm4Config(ete=True, arch_major=5, arch_minor=0, trace_id=0x20 + c) for c in range(2)]
    path = tmp_path / "trbe.data"
    with PerfDataWriter(path, arch="aarch64") as w:
        a = w.set_cs_etm(cfgs)
        for cpu, cfg in enumerate(cfgs):
            data, _, _ = _trace(cfg, rng, 6, 1000)
            w.add_record(
                Aux(0, len(data), AUX_FLAG_CORESIGHT_FORMAT_RAW),
                attr=a,
                sample_id=SampleId(pid=1, tid=1, time=5 + cpu, cpu=cpu),
            )
            w.add_auxtrace(data, cpu=cpu, idx=cpu, reference=10 + cpu)
    bufs = cs_etm_buffers(PerfData(str(path)))
    assert [(b.cpu, b.formatted, list(b.streams)) for b in bufs] == [
        (0, False, [0x20]),
        (1, False, [0x21]),
    ]
    ours = _csdump("-i", str(path)).stdout.splitlines()
    assert {ln.split(";")[1] for ln in ours} == {" ID:20", " ID:21"}
    theirs = _perf_packets(path)

    def strip(lines):
        return [re.sub(r"ID:[0-9a-f]+;", "ID:;", ln) for ln in lines]

    assert strip(ours) == strip(theirs)


def test_version_0_and_registers_read_back(tmp_path):
    """Every register (and extra parameter) written reads back, for header
    versions 0 and 1; ETMv3 blocks are kept (not decoded)."""
    etm4 = {"TRCCONFIGR": 0x10C1, "TRCTRACEIDR": 0x16, "TRCIDR0": 0x28000EA1, "TRCIDR1": 0x4100F424,
            "TRCIDR2": 0x20001088, "TRCIDR8": 3, "TRCAUTHSTATUS": 0xCC}  # fmt: skip
    ete = dict(etm4, TRCTRACEIDR=0x18, TRCIDR1=0x4100F510, TRCDEVARCH=0x47725A13, TS_SOURCE=1)
    etm3 = {"ETMCR": 0x10001000, "ETMTRACEIDR": 0x1A, "ETMCCER": 0x34C01AC2, "ETMIDR": 0x4114F253}
    for version, cpus in (
        (0, [etm4, etm3, dict(etm4, TRCTRACEIDR=0x1C)]),
        (
            1,
            [
                etm4,
                ete,
                etm3,
                CsEtmCpu(7, "ETMv4", dict(etm4, TRCTRACEIDR=0x1E, TS_SOURCE=0), (5, 6)),
            ],
        ),
    ):
        path = tmp_path / f"v{version}.data"
        with PerfDataWriter(path, arch="aarch64") as w:
            w.set_cs_etm(cpus, version=version, pmu_type=33, snapshot=True)
        info = cs_etm_info(PerfData(str(path)))
        assert (info.version, info.pmu_type, info.snapshot) == (version, 33, True)
        for k, (want, got) in enumerate(zip(cpus, info.cpus, strict=True)):
            if isinstance(want, CsEtmCpu):
                assert (got.cpu, got.regs, got.extra) == (want.cpu, want.regs, want.extra)
            else:
                assert got.cpu == k and got.regs == want
        # perf reads the header
        perf = shutil.which("perf")
        if perf and version == 0:
            r = subprocess.run(
                [perf, "report", "-D", "-i", str(path)], capture_output=True, text=True
            )
            assert (
                "TRCIDR2\t\t\t       20001088" in r.stdout
                and "ETMIDR\t\t\t       4114f253" in r.stdout
            )


def _damage(path, at: int, value: int) -> None:
    raw = bytearray(path.read_bytes())
    struct.pack_into("<Q", raw, at, value)
    path.write_bytes(bytes(raw))


def test_damaged_header_is_one_message(tmp_path):
    good = tmp_path / "good.data"
    with PerfDataWriter(good, arch="aarch64") as w:
        w.set_cs_etm([ETM0, ETM1])
        w.add_auxtrace(format_frames([(0x10, b"\0" * 11 + b"\x80")]), cpu=0, reference=1)
    info = cs_etm_info(PerfData(str(good)))
    rec = info.offset
    base = rec + 16
    blk1 = info.cpus[1].offset
    assert blk1 == base + 8 * (3 + 10)
    cases = [
        (blk1, MAGIC["ETMv4"] ^ 1, blk1, "unknown magic"),  # a bad magic
        (blk1 + 16, 200, blk1, "go beyond the record"),  # a parameter count too large
        (blk1 + 16, 3, blk1 + 16, "fewer than"),  # too few
        (base, 3, base, "header version 3"),
        (base + 8, (10 << 32) | 1, blk1, "after the last of 1 CPU blocks"),
        (blk1 + 8 * 4, 0x10, blk1, "same trace ID 0x10"),
        (rec + 8, 1, rec + 8, "not CoreSight ETM"),
    ]
    for at, value, where, what in cases:
        bad = tmp_path / "bad.data"
        bad.write_bytes(good.read_bytes())
        _damage(bad, at, value)
        with pytest.raises(CsEtmError) as e:
            cs_etm_info(PerfData(str(bad)))
        assert e.value.offset == where and what in e.value.message, (what, e.value)
        r = _csdump("-i", str(bad))
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and f"offset {where:#x}" in r.stderr and what in r.stderr


def test_damaged_trace_never_raises(tmp_path):
    """Random AUXTRACE bytes and an AUX record with no AUXTRACE data: the
    listing goes on, each problem a message with its file offset."""
    rng = np.random.default_rng(2)
    path = tmp_path / "junk.data"
    with PerfDataWriter(path, arch="aarch64") as w:
        a = w.set_cs_etm([ETM0, ETM1])
        good, _, _ = _trace(ETM1, rng, 3, 10)
        junk = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
        fr = junk + format_frames([(0x12, good)])
        w.add_record(Aux(0, len(fr), 0), attr=a, sample_id=SampleId(pid=1, tid=1, time=2, cpu=0))
        w.add_record(Aux(1 << 20, 64, 0), attr=a, sample_id=SampleId(pid=1, tid=1, time=3, cpu=1))
        at = w.add_auxtrace(fr, cpu=0, idx=0, reference=1)
    r = _csdump("-i", str(path))
    assert r.returncode == 0 and "Traceback" not in r.stderr
    errs = r.stderr.splitlines()
    assert errs and all(re.search(r"offset 0x[0-9a-f]+", e) for e in errs)
    assert any("has no AUXTRACE data" in e for e in errs)
    # the frames after the junk still list CPU 1's packets
    assert any("ID:12;\tI_TRACE_ON" in ln for ln in r.stdout.splitlines())
    data = PerfData(str(path))
    (b,) = cs_etm_buffers(data)
    assert b.errors and all(at + 48 <= off < at + 48 + len(fr) for off, _ in b.errors)
