"""CoreSight formatter frames: hwtrace.hwevents.csframes against the frame
rules of the CoreSight Architecture Specification and OpenCSD's
trc_pkt_lister (-o_raw_packed / -o_raw_unpacked, -tpiu, -tpiu_hsync)."""

from __future__ import annotations

import random
import re
import subprocess
import tracemalloc
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opencsd_oracle import LISTER, needs_opencsd
from realdata import real_input

from hwtrace.columns import Ramps
from hwtrace.hwevents.csframes import (
    DSTREAM_BLOCK,
    DSTREAM_DATA,
    FSYNC,
    HSYNC,
    FrameError,
    block_indices,
    deformat,
    format_frames,
    frame_dump_lines,
    snapshot_streams,
    trace_ids,
)
from hwtrace.hwevents.cssnapshot import Buffer, Device, Snapshot, read_snapshot, write_snapshot

# A valid STM stream: ASYNC, VERSION 3, M8, C8, D32TS, D8, FLAG, NULL, NULL.
STM = bytes.fromhex("FFFFFFFFFFFFFFFFFFFF0F" + "0F300131506F214365873 24ABAEF00".replace(" ", ""))


def frame(slots: list[tuple[str, int]]) -> bytes:
    """One frame from 15 (kind, value) slots: ("id", ID, aux) at even
    positions or ("d", byte); byte 15 built from the even slots."""
    out = bytearray(16)
    aux = 0
    for i, slot in enumerate(slots):
        if slot[0] == "id":
            out[i] = (slot[1] << 1) | 1
            if len(slot) > 2 and slot[2]:
                aux |= 1 << (i // 2)
        elif i % 2 == 0:
            out[i] = slot[1] & 0xFE
            aux |= (slot[1] & 1) << (i // 2)
        else:
            out[i] = slot[1]
    assert len(slots) == 15
    out[15] = aux
    return bytes(out)


def check_offsets(data: bytes, res, parity: bool = True, mode: str = "memory", ids=None) -> None:
    """Every output byte sits at its offset: odd frame bytes as they are,
    even ones with bit 0 moved to the aux byte (syncs are 2 or 4 bytes, so
    frame parity is file parity, unless junk came before the first FSYNC).
    The offsets as ramps are those offsets, a ramp where one is not one
    more than the one before."""
    ramps = deformat(data, mode=mode, ids=ids, as_ramps=True).offsets
    assert ramps.keys() == res.offsets.keys()
    for tid, r in ramps.items():
        offs = res.offsets[tid]
        assert isinstance(r, Ramps) and np.array_equal(np.asarray(r), offs)
        assert r.starts.tolist() == [0, *(np.flatnonzero(np.diff(offs) != 1) + 1).tolist()]
    raw = np.frombuffer(data, np.uint8)
    for tid, stream in res.streams.items():
        offs = res.offsets[tid]
        got = np.frombuffer(stream, np.uint8)
        assert offs.shape == got.shape
        assert np.all(np.diff(offs) > 0)
        if not parity:
            at = raw[offs]
            assert np.all((at == got) | (at == (got & 0xFE)))
            continue
        odd = (offs & 1) == 1
        assert np.array_equal(raw[offs[odd]], got[odd])
        assert np.array_equal(raw[offs[~odd]], got[~odd] & 0xFE)


def expected_streams(chunks) -> dict[int, bytes]:
    want: dict[int, bytearray] = defaultdict(bytearray)
    for tid, payload in chunks:
        if payload:
            want[tid] += payload
    return {k: bytes(v) for k, v in want.items()}


# ---------------------------------------------------------------- spec rules


def test_hand_made_frames():
    f1 = frame(
        [("id", 0x10), ("d", 0xA1)]  # ID 0x10 from the next byte
        + [("d", 0x03), ("d", 0x04)]  # even data byte 0x03: bit 0 from aux
        + [("id", 0x20, 1), ("d", 0x05)]  # change after: 0x05 still ID 0x10
        + [("d", 0x07), ("d", 0x08)]
        + [("id", 0x20), ("d", 0x09)]  # same ID again: no change
        + [("id", 0x00), ("d", 0x00)]  # null ID: padding
        + [("id", 0x11), ("d", 0x0B)]
        + [("id", 0x12)]  # ID in byte 14: from the next frame
    )
    f2 = frame([("d", 0xC1), ("d", 0xC2)] + [("d", 0xEE)] * 13)
    data = f1 + f2
    assert f1[15] == 0b00001110  # aux bits: 1 (0x03's bit 0), 2 (change after), 3 (0x07)
    assert f1[0] == 0x21 and f1[2] == 0x02 and f1[4] == 0x41 and f1[14] == 0x25
    res = deformat(data)
    assert res.errors == []
    assert res.streams == {
        0x10: b"\xa1\x03\x04\x05",
        0x20: b"\x07\x08\x09",
        0x11: b"\x0b",
        0x12: b"\xc1\xc2" + b"\xee" * 13,
    }
    assert res.offsets[0x10].tolist() == [1, 2, 3, 5]
    assert res.offsets[0x20].tolist() == [6, 7, 9]
    assert res.offsets[0x11].tolist() == [13]
    assert res.offsets[0x12].tolist() == list(range(16, 31))
    assert res.counts["frames"] == 2
    assert res.counts["null_bytes"] == 1
    assert res.counts["id_bytes"] == 6
    check_offsets(data, res)


def test_format_frames_bytes():
    data = format_frames([(0x10, bytes(range(1, 20))), (0x20, b"\xaa\xbb\xcc"), (0x10, b"\x01")])
    # frame 0: ID 0x10, then 14 data bytes (even ones with bit 0 in aux)
    assert data[:16] == bytes.fromhex("21 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 00")
    # frame 1: 0x0f 0x10 0x11 0x12 | ID 0x20 deferred past 0x13 | aa bb |
    # ID 0x10 deferred past cc | null ID deferred past 01 | padding 00 00 00
    assert data[16:] == bytes.fromhex("0e 10 10 12 41 13 aa bb 21 cc 01 01 00 00 00 37")
    aux = data[31]
    assert aux & 1 and aux & 2  # 0x0f and 0x11 have bit 0 set
    assert aux & (1 << 2) and aux & (1 << 4) and aux & (1 << 5)  # deferred changes
    res = deformat(data)
    assert res.streams == {0x10: bytes(range(1, 20)) + b"\x01", 0x20: b"\xaa\xbb\xcc"}
    assert res.counts["null_bytes"] == 3


def test_format_frames_syncs_and_repeated_id():
    chunks = [(0x10, bytes(range(30))), (0x11, b"\x55" * 3)]
    data = format_frames(chunks, fsync_every=2, hsync=True)
    assert data.startswith(FSYNC)
    # the second chunk starts mid-frame: an HSYNC before its pair
    assert HSYNC in data[4:]
    res = deformat(data, mode="hsync")
    assert res.errors == [] and res.streams == expected_streams(chunks)
    assert res.counts["fsyncs"] == 2 and res.counts["hsyncs"] == 1
    check_offsets(data, res, mode="hsync")
    # fsync mode refuses the HSYNC (reported, skipped): the data survives
    res = deformat(data, mode="fsync")
    assert [m for _, m in res.errors] == ["HSYNC in a stream without HSYNCs, skipped"]
    assert res.streams == expected_streams(chunks)
    # a long single-source run: the ID byte is repeated every 3 frames
    long = format_frames([(0x33, bytes(200))], repeat_id=3)
    id_frames = [k for k in range(0, len(long), 16) if long[k] == 0x67]
    assert id_frames[:3] == [0, 64, 128]
    assert deformat(long).streams == {0x33: bytes(200)}


def test_format_frames_rejects_bad_ids():
    with pytest.raises(ValueError):
        format_frames([(0x7F, b"x")])
    with pytest.raises(ValueError):
        format_frames([(1, b"x")], pad_id=0x80)
    assert format_frames([]) == b"" and format_frames([(3, b"")]) == b""


chunk_lists = st.lists(
    st.tuples(st.sampled_from([0x01, 0x10, 0x11, 0x2A, 0x6F]), st.binary(min_size=0, max_size=40)),
    min_size=0,
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=chunk_lists,
    mode=st.sampled_from(["memory", "fsync", "hsync"]),
    fsync_every=st.integers(1, 5),
    repeat_id=st.sampled_from([0, 1, 8]),
)
def test_roundtrip(chunks, mode, fsync_every, repeat_id):
    tpiu = mode != "memory"
    data = format_frames(
        chunks, fsync_every=fsync_every if tpiu else 0, hsync=mode == "hsync", repeat_id=repeat_id
    )
    res = deformat(data, mode=mode)
    assert res.errors == []
    assert res.streams == expected_streams(chunks)
    check_offsets(data, res, mode=mode)
    if mode == "memory":
        assert len(data) % 16 == 0 and res.frames == len(data) // 16


# ---------------------------------------------------------------- bad input


def test_truncated_last_frame():
    data = format_frames([(0x10, bytes(range(40)))])
    res = deformat(data[:-5])
    start = (len(data) - 5) // 16 * 16
    assert res.errors == [(start, "truncated frame: 11 bytes of an incomplete frame at the end")]
    assert res.streams[0x10] == bytes(range(40))[: 15 * (start // 16) - 1]
    assert res.counts["dropped_bytes"] == 11
    with pytest.raises(FrameError) as e:
        deformat(data[:-5], strict=True)
    assert e.value.offset == start


def test_fsync_mode_without_sync():
    data = format_frames([(0x10, bytes(100))])  # memory frames, no FSYNC
    res = deformat(data, mode="fsync")
    assert res.errors == [(0, f"no FSYNC: {len(data)} bytes before frame synchronisation skipped")]
    assert res.streams == {}
    # junk before the first FSYNC is skipped and reported
    tpiu = format_frames([(0x10, b"abc" * 20)], fsync_every=4)
    res = deformat(b"\x12\x34\x56" + tpiu, mode="fsync")
    assert res.errors == [(0, "no FSYNC: 3 bytes before frame synchronisation skipped")]
    assert res.streams == {0x10: b"abc" * 20}
    assert res.offsets[0x10][0] == 3 + 4 + 1


def test_dstream_footers_are_not_trace():
    """A DSTREAM capture: 504 bytes of TPIU stream, an 8-byte footer, and
    so on; the footers (here bytes that would read as an FSYNC and an ID)
    are skipped, offsets are the file's, indices OpenCSD's (footers not
    counted)."""
    chunks = [(0x10 + k % 3, bytes(range(k, k + 29))) for k in range(60)]
    tpiu = format_frames(chunks, fsync_every=4)
    tpiu += FSYNC * ((-len(tpiu) % DSTREAM_DATA) // 4)
    footer = FSYNC + b"\x21\x00\x00\x00"
    blocks = [tpiu[k : k + DSTREAM_DATA] for k in range(0, len(tpiu), DSTREAM_DATA)]
    capture = b"".join(b + footer for b in blocks)
    assert len(blocks) >= 3 and len(capture) == len(blocks) * DSTREAM_BLOCK
    want, got = deformat(tpiu, mode="fsync"), deformat(capture, mode="dstream")
    assert got.errors == [] and got.streams == want.streams
    ramps = deformat(capture, mode="dstream", as_ramps=True).offsets
    for tid, offs in want.offsets.items():
        assert (got.offsets[tid] == offs + (offs // DSTREAM_DATA) * 8).all()
        assert capture[int(got.offsets[tid][-1])] == tpiu[int(offs[-1])]
        # (a ramp is cut where a footer comes between two of its bytes)
        assert np.array_equal(np.asarray(ramps[tid]), got.offsets[tid])
        assert len(ramps[tid].starts) == 1 + np.count_nonzero(np.diff(got.offsets[tid]) != 1)
    for tid, idx in block_indices(tpiu, "fsync").items():
        assert (block_indices(capture, "dstream")[tid] == idx).all()
    # read as a plain TPIU stream, the footers break frames
    assert deformat(capture, mode="fsync").errors


def test_fsync_inside_frame_resynchronises():
    a = format_frames([(0x10, b"A" * 45)], fsync_every=1)  # 3 frames
    b = format_frames([(0x11, b"B" * 30)], fsync_every=1)
    cut = a[: 4 + 16 + 4 + 7]  # second frame broken off after 7 bytes
    res = deformat(cut + b, mode="fsync")
    # six bytes of frame and one left over before the FSYNC
    assert res.errors == [(24, "FSYNC inside a frame: 7 bytes of the partial frame dropped")]
    assert res.streams[0x11] == b"B" * 30
    assert res.streams[0x10] == b"A" * 14  # frame 0: the ID byte and 14 data bytes
    # a stray single byte shifts the stream off the 16-bit grid
    res = deformat(a[:20] + b"\x00" + b, mode="fsync")
    assert res.errors == [(20, "FSYNC inside a frame: 1 bytes of the partial frame dropped")]
    assert res.streams == {0x10: b"A" * 14, 0x11: b"B" * 30}


def test_reserved_unknown_and_missing_ids():
    f_noid = frame([("d", 0x40)] * 15)  # data before any ID
    f_res = frame(
        [("id", 0x72), ("d", 1), ("d", 2), ("d", 3), ("id", 0x7D), ("d", 9), ("id", 0x10)]
        + [("d", 0x44)] * 8
    )
    f_unknown = frame(
        [("id", 0x33), ("d", 7), ("d", 8), ("d", 9)]
        + [("id", 0x10), ("d", 0x55)]
        + [("d", 0x66)] * 9
    )
    data = f_noid + f_res + f_unknown
    res = deformat(data, ids=[0x10])
    assert res.errors == [
        (0, "data before any trace ID"),
        (16, "reserved trace ID 0x72"),
        (32 + 0, "unknown trace ID 0x33"),
    ]
    assert res.triggers.tolist() == [16 + 4]
    assert res.streams == {0x10: b"\x44" * 8 + b"\x55" + b"\x66" * 9}
    assert res.counts["no_id_bytes"] == 15
    assert res.counts["reserved_bytes"] == 3
    assert res.counts["trigger_bytes"] == 1
    assert res.counts["unknown_id_bytes"] == 3
    # without an ID list every source ID is kept
    assert set(deformat(data).streams) == {0x10, 0x33}
    check_offsets(data, res, ids=[0x10])


def test_barrier_frame_resets_the_id():
    a = format_frames([(0x10, b"x" * 15)])
    more = frame([("d", 0x20)] * 15)
    res = deformat(a + FSYNC * 4 + more)
    assert res.counts["barriers"] == 1
    assert res.streams == {0x10: b"x" * 15}
    assert res.errors == [(len(a) + 16, "data before any trace ID")]


def conserved(data: bytes, res) -> None:
    c = res.counts
    kept = sum(len(s) for s in res.streams.values())
    assert kept == c["data_bytes"]
    assert len(data) == 16 * c["frames"] + 4 * c["fsyncs"] + 2 * c["hsyncs"] + c["dropped_bytes"]
    used = c["id_bytes"] + c["data_bytes"] + c["null_bytes"] + c["reserved_bytes"]
    used += c["trigger_bytes"] + c["unknown_id_bytes"] + c["no_id_bytes"]
    assert used == 15 * c["frames"]


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.lists(
            st.sampled_from([FSYNC, HSYNC, b"\xff", b"\x21", b"\x00\x01", bytes(16), b"\x7f"]),
            max_size=60,
        ).map(b"".join),
    ),
    mode=st.sampled_from(["memory", "fsync", "hsync"]),
    ids=st.sampled_from([None, [0x10], []]),
)
def test_random_bytes_never_raise(data, mode, ids):
    res = deformat(data, mode=mode, ids=ids)
    conserved(data, res)
    check_offsets(data, res, parity=mode == "memory", mode=mode, ids=ids)
    assert all(0 <= off < max(len(data), 1) for off, _ in res.errors)
    list(frame_dump_lines(data, mode))


@settings(max_examples=80, deadline=None)
@given(
    chunks=chunk_lists.filter(lambda c: sum(len(p) for _, p in c) > 0),
    seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(["fsync", "hsync"]),
)
def test_damaged_tpiu_keeps_the_rest(chunks, seed, mode):
    """Bytes lost from a TPIU stream: from the next FSYNC on, the data is
    what that part decodes to on its own."""
    data = format_frames(chunks, fsync_every=1, hsync=mode == "hsync")
    rng = random.Random(seed)
    cut = rng.randrange(len(data))
    lost = rng.randint(1, 5)
    damaged = data[:cut] + data[cut + lost :]
    res = deformat(damaged, mode=mode)
    conserved(damaged, res)
    check_offsets(damaged, res, parity=False, mode=mode)
    resync = data.find(FSYNC, cut + lost)
    if resync < 0:
        return
    tail = deformat(data[resync:], mode=mode)
    assert {m for _, m in tail.errors} <= {"data before any trace ID"}
    shift = resync - lost
    for tid in set(res.streams) | set(tail.streams):
        offs = res.offsets.get(tid, np.empty(0, np.int64))
        keep = offs >= shift
        mine = np.frombuffer(res.streams.get(tid, b""), np.uint8)[keep].tobytes()
        theirs = tail.streams.get(tid, b"")
        # bytes the part alone cannot attribute may still carry the old ID
        assert mine.endswith(theirs)
        assert len(mine) - len(theirs) <= tail.counts["no_id_bytes"]
        assert np.array_equal(
            offs[keep][len(mine) - len(theirs) :] - shift, tail.offsets.get(tid, offs[:0])
        )


# ---------------------------------------------------------------- snapshots


def test_trace_ids_and_snapshot_streams(tmp_path):
    s1 = STM
    s2 = bytes(range(0, 200, 3))
    formatted = format_frames(
        [(0x10, s1[:7]), (0x22, s2[:40]), (0x10, s1[7:]), (0x22, s2[40:]), (0x05, b"zz")]
    )
    snap = Snapshot(
        devices=[
            Device("cpu_0", "Cortex-A53", cls="core"),
            Device("ETM_0", "ETM4", regs={"TRCTRACEIDR": 0x05, "TRCCONFIGR": 0}),
            Device("STM_0", "STM", regs={"STMTCSR": 0x00100003}, offsets={"STMTCSR": 0xE80}),
            Device("PTM_0", "PTM1.1", regs={"ETMTRACEIDR": 0x22}),
            Device("STM_1", "STM", regs={"STMTCSR": 0x00300003}),
        ],
        buffers=[
            Buffer("ETB_0", formatted, format="coresight"),
            Buffer("RAW", b"\x01\x02", format="source_data"),
        ],
        source_buffers={"ETM_0": "ETB_0", "STM_0": "ETB_0", "PTM_0": "ETB_0", "STM_1": "RAW"},
    )
    write_snapshot(tmp_path, snap)
    back = read_snapshot(tmp_path)
    assert trace_ids(back) == {"ETM_0": 0x05, "STM_0": 0x10, "PTM_0": 0x22, "STM_1": 0x30}
    assert snapshot_streams(back) == {
        "ETM_0": b"zz",
        "STM_0": s1,
        "PTM_0": s2,
        "STM_1": b"\x01\x02",
    }
    back.buffers[0].format = "dstream_coresight"
    back.buffers[0].data = format_frames([(0x10, s1)], fsync_every=2)
    assert snapshot_streams(back)["STM_0"] == s1
    back.buffers[0].format = "weird"
    with pytest.raises(FrameError):
        snapshot_streams(back)


# ---------------------------------------------------------------- OpenCSD


IDS = [0x10, 0x11, 0x2A, 0x6F]
LISTER_ARGS = {"memory": [], "fsync": ["-tpiu"], "hsync": ["-tpiu", "-tpiu_hsync"]}


def stm_snapshot(directory, data: bytes, ids=IDS) -> None:
    devs = [
        Device(f"STM_{i}", "STM", regs={"STMTCSR": (t << 16) | 0x3}, offsets={"STMTCSR": 0x3A0})
        for i, t in enumerate(ids)
    ]
    write_snapshot(
        directory,
        Snapshot(
            devices=devs,
            buffers=[Buffer("BUF_0", data, format="coresight", file="trace.bin")],
            source_buffers={d.name: "BUF_0" for d in devs},
        ),
    )


def lister_frames(directory, mode: str) -> tuple[list[str], str]:
    """The lister's frame lines (with their continuation lines) and its output."""
    out = subprocess.run(
        [
            LISTER,
            "-ss_dir",
            str(directory),
            "-logstdout",
            "-o_raw_packed",
            "-o_raw_unpacked",
            *LISTER_ARGS[mode],
        ],
        capture_output=True,
        cwd=str(directory),  # its log file stays there
        text=True,
        timeout=60,
        errors="replace",
    ).stdout
    lines: list[str] = []
    inside = False
    for line in out.splitlines():
        if line.startswith("Frame Data"):
            inside = True
            lines.append(line)
        elif inside and re.fullmatch(r"([0-9a-f]{2} )+", line):
            lines.append(line)
        else:
            inside = False
    return lines, out


_UNPACKED = re.compile(r"^Frame Data; Index\s*\d+;\s+ID_DATA\[(0x[0-9a-f]{2}|\?\?\?\?)\]; (.*)$")


def unpacked_by_id(lines: list[str]) -> dict[int, bytes]:
    got: dict[int, bytearray] = defaultdict(bytearray)
    current = None
    for line in lines:
        m = _UNPACKED.match(line)
        if m:
            current = None if m.group(1) == "????" else int(m.group(1), 16)
            text = m.group(2)
        elif line.startswith("Frame Data"):
            current = None
            continue
        else:
            text = line
        if current is not None and current in IDS:
            got[current] += bytes.fromhex(text)
    return dict(got)


def stm_chunks(rng: random.Random, n: int) -> list[tuple[int, bytes]]:
    """Several sources each sending a valid STM stream, cut into pieces
    and interleaved."""
    streams = {tid: STM * rng.randint(1, 4) for tid in IDS}
    pos = dict.fromkeys(IDS, 0)
    chunks = []
    for _ in range(n):
        tid = rng.choice(IDS)
        size = rng.choice([1, 1, 2, 3, 7, 16, 33])
        piece = streams[tid][pos[tid] : pos[tid] + size]
        if not piece:
            continue
        pos[tid] += len(piece)
        chunks.append((tid, piece))
    return chunks


@needs_opencsd
@pytest.mark.parametrize("mode", ["memory", "fsync", "hsync"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_agrees_with_opencsd(tmp_path, mode, seed):
    rng = random.Random(seed * 7 + len(mode))
    chunks = stm_chunks(rng, 120)
    data = format_frames(
        chunks,
        fsync_every=rng.choice([1, 2, 5]) if mode != "memory" else 0,
        hsync=mode == "hsync",
        repeat_id=rng.choice([0, 2, 8]),
    )
    assert len(data) < 1024 or mode == "memory"  # the lister reads 1 KiB blocks
    stm_snapshot(tmp_path, data)
    theirs, out = lister_frames(tmp_path, mode)
    ours = list(frame_dump_lines(data, mode))
    assert "fatal" not in out
    assert ours == theirs
    res = deformat(data, mode=mode)
    assert unpacked_by_id(theirs) == res.streams == expected_streams(chunks)
    # the STM decoder behind each ID saw whole packets
    asyncs = len(re.findall(r"ASYNC:Alignment", out))
    assert asyncs == sum(s.count(STM[:11]) for s in res.streams.values())


@needs_opencsd
@pytest.mark.parametrize("seed", range(4))
def test_random_frames_agree_with_opencsd(tmp_path, seed):
    """Arbitrary frames (reserved IDs, triggers, deferred changes, IDs in
    byte 14, data before any ID).  OpenCSD stops at the first empty run of a
    decoded ID (a zero-length block is fatal to its packet processor), so
    its lines must be a prefix of ours ending there."""
    rng = random.Random(seed)
    data = bytearray()
    for _ in range(40):
        f = bytearray(rng.randrange(256) for _ in range(16))
        for i in range(0, 15, 2):
            r = rng.random()
            if r < 0.3:
                f[i] = (rng.choice([0, 1, 0x10, 0x11, 0x70, 0x7D, 0x7E, 0x5A]) << 1) | 1
            elif r < 0.7:
                f[i] &= 0xFE
        data += f
    stm_snapshot(tmp_path, bytes(data), ids=[0x10, 0x11])
    theirs, out = lister_frames(tmp_path, "memory")
    ours = list(frame_dump_lines(bytes(data), "memory"))
    assert len(theirs) > 16
    assert ours[: len(theirs)] == theirs
    if len(theirs) < len(ours):
        assert "Zero length data block" in out
        assert re.match(r"Frame Data; Index\s*\d+;\s+ID_DATA\[0x1[01]\]; $", theirs[-1])


def test_a_real_buffer_cut_takes_a_few_bytes_per_trace_byte():
    """Cutting a real ETR buffer (1 MB: 974,749 bytes of one ETM) into
    its streams keeps each byte's file offset as ramps: what the cut
    allocates at its peak stays under five bytes per trace byte (as
    arrays, ten: the offsets alone took eight)."""
    path = real_input("opencsd-snapshots") / "bugfix-exact-match" / "cstrace.bin"
    data = path.read_bytes()
    want = deformat(data)
    deformat(data, as_ramps=True)  # (compiled, its first-call costs paid)
    tracemalloc.start()
    try:
        got = deformat(data, as_ramps=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.streams == want.streams and len(got.streams[0x12]) == 974_749
    for tid, offs in want.offsets.items():
        assert np.array_equal(np.asarray(got.offsets[tid]), offs)
    assert peak < 5 * len(data)
