"""perf_event records (hwtrace.perf.records) and the libipt-sb sideband
emulation of ``hwtrace ptdump``/``hwtrace ptxed`` (--pevent:*, --sb:*)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.perf import records as R

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)

BODIES = st.one_of(
    st.builds(R.Mmap, u32, u32, u64, u64, u64, text, st.booleans()),
    st.builds(
        R.Mmap2, u32, u32, u64, u64, u64, u32, u32, u64, u64, u32, u32, text, st.none(),
        st.booleans(),
    ),
    st.builds(
        R.Mmap2, u32, u32, u64, u64, u64, prot=u32, flags=u32, filename=text,
        build_id=st.binary(max_size=20), data=st.booleans(),
    ),
    st.builds(R.Lost, u64, u64),
    st.builds(R.Comm, u32, u32, text, st.booleans()),
    st.builds(R.Exit, u32, u32, u32, u32, u64),
    st.builds(R.Fork, u32, u32, u32, u32, u64),
    st.builds(R.Throttle, u64, u64, u64),
    st.builds(R.Unthrottle, u64, u64, u64),
    st.builds(R.Read, u32, u32, st.binary(max_size=64).map(lambda b: b[: len(b) // 8 * 8])),
    st.builds(R.Aux, u64, u64, u64),
    st.builds(R.ItraceStart, u32, u32),
    st.builds(R.LostSamples, u64),
    st.builds(R.Switch, st.booleans(), st.booleans()),
    st.builds(R.SwitchCpuWide, u32, u32, st.booleans(), st.booleans()),
    st.builds(R.Namespaces, u32, u32, st.lists(st.tuples(u64, u64), max_size=7).map(tuple)),
    st.builds(R.Ksymbol, u64, u32, u16, u16, text),
    st.builds(R.BpfEvent, u16, u16, u32, st.binary(min_size=8, max_size=8)),
    st.builds(R.Cgroup, u64, text),
    st.builds(R.TextPoke, u64, st.binary(max_size=40), st.binary(max_size=40)),
    st.builds(R.AuxOutputHwId, u64),
)  # fmt: skip

SAMPLE_TYPES = st.integers(0, (1 << 25) - 1)


@st.composite
def sample_ids(draw, sample_type):
    def field(bit, strat):
        return draw(strat) if sample_type & bit else None

    T = R.SampleType
    tid = sample_type & T.TID
    return R.SampleId(
        pid=draw(u32) if tid else None,
        tid=draw(u32) if tid else None,
        time=field(T.TIME, u64),
        id=field(T.ID, u64),
        stream_id=field(T.STREAM_ID, u64),
        cpu=field(T.CPU, u32),
        identifier=field(T.IDENTIFIER, u64),
    )


@st.composite
def records(draw):
    body = draw(BODIES)
    sample_type = draw(SAMPLE_TYPES)
    sid = draw(sample_ids(sample_type))
    misc = draw(st.sampled_from([0, 1, 2, 3, 0x8000]))
    return body, sample_type, sid, misc


@settings(max_examples=300, deadline=None)
@given(records(), st.binary(max_size=16))
def test_pack_parse_round_trip(rec, prefix):
    body, sample_type, sid, misc = rec
    data = R.pack_record(body, sample_type, misc=misc, sample_id=sid)
    assert len(data) % 8 == 0
    buf = prefix + data + b"\xff" * 3
    parsed = R.parse_record(buf, len(prefix), sample_type)
    assert parsed.body == body
    assert parsed.sample_id == sid
    assert parsed.type == body.TYPE
    assert parsed.size == len(data)
    assert parsed.misc & R.MISC_CPUMODE_MASK == misc & R.MISC_CPUMODE_MASK
    # and back again, byte for byte
    again = R.pack_record(parsed.body, sample_type, misc=parsed.misc, sample_id=parsed.sample_id)
    assert again == data


@settings(max_examples=100, deadline=None)
@given(BODIES, SAMPLE_TYPES)
def test_without_sample_id_all(body, sample_type):
    data = R.pack_record(body, sample_type, sample_id_all=False)
    parsed = R.parse_record(data, 0, sample_type, sample_id_all=False)
    assert parsed.body == body and parsed.sample_id is None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=120), SAMPLE_TYPES, st.integers(0, 16))
def test_garbage_raises_record_error_only(data, sample_type, offset):
    try:
        rec = R.parse_record(data, offset, sample_type)
    except R.RecordError as exc:
        assert f"{exc.offset:#x}" in str(exc)
    else:
        assert rec.end <= len(data)


def test_sample_id_size_and_layout():
    T = R.SampleType
    st_all = T.TID | T.TIME | T.ID | T.STREAM_ID | T.CPU | T.IDENTIFIER
    assert R.sample_id_size(st_all) == 48
    assert R.sample_id_size(T.IP | T.ADDR | T.PERIOD) == 0
    sid = R.SampleId(1, 2, 3, 4, 5, 6, 7)
    raw = R.pack_sample_id(sid, st_all)
    # kernel order: pid tid time id stream_id cpu res identifier
    assert raw[:8] == (1).to_bytes(4, "little") + (2).to_bytes(4, "little")
    assert raw[32:36] == (6).to_bytes(4, "little")
    assert R.parse_sample_id(b"xx" + raw, 2 + len(raw), st_all) == sid


def test_unknown_and_sample_types_keep_raw_bytes():
    raw = R.pack_record(b"\1\2\3\4\5\6\7\x08", type=R.RecordType.SAMPLE)
    rec = R.parse_record(raw, 0, 0x4)
    assert rec.type is R.RecordType.SAMPLE and rec.body == b"\1\2\3\4\5\6\7\x08"
    raw = R.pack_record(b"abcdefgh", type=200)
    rec = R.parse_record(raw, 0, 0)
    assert rec.type == 200 and rec.body == b"abcdefgh" and rec.sample_id is None


def test_misc_bits():
    data = R.pack_record(R.Switch(out=True, preempt=True), 0)
    assert int.from_bytes(data[4:6], "little") == R.MISC_SWITCH_OUT | R.MISC_SWITCH_OUT_PREEMPT
    data = R.pack_record(R.Comm(1, 1, "x", exec=True), 0, misc=R.MISC_CPUMODE_MASK & 2)
    assert int.from_bytes(data[4:6], "little") == R.MISC_COMM_EXEC | 2
    rec = R.parse_record(R.pack_record(R.Mmap2(1, 2, 3, 4, 5, build_id=b"\xaa" * 20), 0), 0, 0)
    assert rec.misc & R.MISC_MMAP_BUILD_ID and rec.body.build_id == b"\xaa" * 20


def _with_size(data: bytes, size: int) -> bytes:
    return data[:6] + size.to_bytes(2, "little") + data[8:]


TIME = int(R.SampleType.TIME)
LOST = R.pack_record(R.Lost(1, 2), TIME)


@pytest.mark.parametrize(
    ("data", "offset", "sample_type", "words"),
    [
        (b"\1\0\0\0\0\0", 0, 0, "truncated header"),
        (_with_size(LOST, 4), 0, TIME, "impossible size 4"),
        (_with_size(LOST, 0x100), 0, TIME, "beyond the end"),
        (_with_size(LOST, 24), 0, TIME, "too small for LOST"),
        (b"\0" * 8 + _with_size(R.pack_record(R.Aux(1, 2, 3), TIME), 24), 8, TIME,
         "too small for AUX"),
        (R.pack_record(R.Comm(1, 1, "abcdefg"), 0).replace(b"abcdefg\0", b"abcdefgh"), 0, 0,
         "comm is not NUL-terminated"),
        (R.pack_record(R.Mmap(1, 1, 0, 0, 0, "f"), 0)[:-1], 0, 0, "beyond the end"),
    ],
)  # fmt: skip
def test_bad_records(data, offset, sample_type, words):
    with pytest.raises(R.RecordError) as info:
        R.parse_record(data, offset, sample_type)
    assert words in str(info.value)
    assert f"offset {offset:#x}" in str(info.value)
    assert info.value.offset == offset


def test_bodies_are_frozen():
    body = R.Lost(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        body.id = 3  # type: ignore[misc]


# -- libipt-sb emulation -----------------------------------------------------


def test_perf_time_to_tsc():
    from hwtrace.perf.pevent import PeventConfig, apply_tsc_offset, perf_time_to_tsc

    assert perf_time_to_tsc(0, PeventConfig(time_zero=5)) == 0  # synthesized: time 0
    assert perf_time_to_tsc(7, PeventConfig()) == 7
    # tsc = ((time - zero) / mult) << shift, remainder kept
    cfg = PeventConfig(time_zero=100, time_mult=3, time_shift=4)
    assert perf_time_to_tsc(100 + 10, cfg) == (3 << 4) + ((1 << 4) // 3)
    assert apply_tsc_offset(10, 3) == 7
    assert apply_tsc_offset(2, 3) == 0  # never wraps to the far future
    assert apply_tsc_offset(2, (1 << 64) - 3) == 5  # a negative offset: later


def test_compact_and_verbose_text():
    from hwtrace.perf.pevent import P_COMPACT, P_OFFSET, P_TSC, P_VERBOSE, PeventConfig, PeventFile

    T = R.SampleType
    st_ = int(T.TID | T.TIME | T.CPU)
    sid = R.SampleId(pid=1, tid=2, time=3, cpu=4)
    data = R.pack_record(R.Comm(1, 2, "sh", exec=True), st_, sample_id=sid)
    f = PeventFile("x.sb", data, PeventConfig(sample_type=st_))
    assert f.fetch() and f.tsc == 3
    text = f.format(P_COMPACT | P_OFFSET | P_TSC)
    assert " ".join(text.split()) == (
        "0000000000000000 0000000000000003 PERF_RECORD_COMM.EXEC 1/2, sh { 1/2 3 cpu-4 }"
    )
    assert f.format(P_VERBOSE).splitlines() == [
        "PERF_RECORD_COMM.EXEC", "  pid: 1", "  tid: 2", "  comm: sh",
        "  pid: 1", "  tid: 2", "  time: 3", "  cpu: 4",
    ]  # fmt: skip
    assert not f.fetch()


# -- bad sideband input: one clear message, never a traceback -----------------


def _case_files(conformance_dir, tmp_path):
    import shutil

    cases = conformance_dir / "cases"
    for name in ("pevent-fork.pt", "pevent-fork.bin"):
        shutil.copy(cases / name, tmp_path)
    sb = next(cases.glob("pevent-fork-pevent-primary,*.sb")).read_bytes()
    return tmp_path, sb


def _run(tmp_path, tool, sbfile):
    import subprocess
    import sys
    from pathlib import Path

    hwtrace = Path(sys.executable).with_name("hwtrace")
    side = ["--sb", "--sb:offset", "--pevent:sample-type", "4", "--pevent:primary", sbfile]
    if tool == "ptdump":
        argv = [str(hwtrace), "ptdump", *side, "pevent-fork.pt"]
    else:
        argv = [str(hwtrace), "ptxed", "--raw", "pevent-fork.bin:0x1000", "--no-inst",
                "--pt", "pevent-fork.pt", *side]  # fmt: skip
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("tool", ["ptdump", "ptxed"])
def test_missing_sideband_file(conformance_dir, tmp_path, tool):
    where, _ = _case_files(conformance_dir, tmp_path)
    r = _run(where, tool, "missing.sb")
    assert r.returncode != 0
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "missing.sb" in r.stderr
    assert "No such file" in r.stderr


@pytest.mark.parametrize("tool", ["ptdump", "ptxed"])
@pytest.mark.parametrize(
    ("damage", "stderr_words", "stdout_words"),
    [
        # the last record (FORK at 0x98) cut short: Intel's tools stop silently
        (lambda d: d[:-5], "offset 0x98: sideband ends early", None),
        # the second record's size says 4: less than a header
        (lambda d: d[:0x46] + b"\x04\x00" + d[0x48:], "offset 0x40: impossible record size 4",
         "[bad.sb:0000000000000040 sideband error: decoder out of sync]"),
        # the first record's size is too small for an MMAP
        (lambda d: d[:6] + b"\x20\x00" + d[8:], "offset 0x0: size 32 is too small for MMAP",
         "[bad.sb:0000000000000000 sideband error: decoder out of sync]"),
    ],
)  # fmt: skip
def test_bad_sideband_records(conformance_dir, tmp_path, tool, damage, stderr_words, stdout_words):
    where, sb = _case_files(conformance_dir, tmp_path)
    (where / "bad.sb").write_bytes(damage(sb))
    r = _run(where, tool, "bad.sb")
    assert r.returncode == 0
    assert "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1
    assert "bad.sb" in r.stderr and stderr_words in r.stderr
    if stdout_words:
        assert stdout_words in r.stdout.splitlines()
    # the trace itself is still decoded (ptxed may miss the kernel mapping)
    assert ("tip.pgd" if tool == "ptdump" else "ffffffff80000000") in r.stdout
