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
