"""The packet codec: round trips, synchronisation, errors, chunking."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.pt.config import Cpu, PtConfig
from hwtrace.pt.kinds import DecodeError, Kind
from hwtrace.pt.packets import (
    Packet,
    compress_ip,
    count_packets,
    decode,
    decode_file,
    decode_range,
    encode,
    iter_chunks,
    psb_chunks,
    psb_plus_end,
    sync_backward,
    sync_forward,
)

PSB = Packet(Kind.PSB)
PSBEND = Packet(Kind.PSBEND)
U = st.integers


def ip_packet(kind):
    return st.sampled_from([0, 1, 2, 3, 4, 6]).flatmap(
        lambda ipc: U(0, (1 << {0: 0, 1: 16, 2: 32, 3: 48, 4: 48, 6: 64}[ipc]) - 1).map(
            lambda ip: Packet(kind, ip, ipc)
        )
    )


def tnt(kind, maxbits):
    return U(1, maxbits).flatmap(lambda n: U(0, (1 << n) - 1).map(lambda v: Packet(kind, v, n)))


PACKETS = st.one_of(
    st.just(Packet(Kind.PAD)),
    st.just(PSB),
    st.just(PSBEND),
    st.just(Packet(Kind.OVF)),
    st.just(Packet(Kind.STOP)),
    tnt(Kind.TNT8, 6),
    tnt(Kind.TNT64, 47),
    *(ip_packet(k) for k in (Kind.TIP, Kind.TIP_PGE, Kind.TIP_PGD, Kind.FUP)),
    U(0, 7).map(lambda m: Packet(Kind.MODE_EXEC, m)),
    U(0, 3).map(lambda m: Packet(Kind.MODE_TSX, m)),
    st.tuples(U(0, (1 << 47) - 1), U(0, 1)).map(lambda t: Packet(Kind.PIP, t[0] << 5, t[1])),
    U(0, (1 << 40) - 1).map(lambda v: Packet(Kind.VMCS, v << 12)),
    U(0, 255).map(lambda v: Packet(Kind.CBR, v)),
    U(0, (1 << 56) - 1).map(lambda v: Packet(Kind.TSC, v)),
    U(0, 255).map(lambda v: Packet(Kind.MTC, v)),
    st.tuples(U(0, 0xFFFF), U(0, 0x1FF)).map(lambda t: Packet(Kind.TMA, *t)),
    U(0, (1 << 61) - 1).map(lambda v: Packet(Kind.CYC, v)),
    U(0, (1 << 64) - 1).map(lambda v: Packet(Kind.MNT, v)),
    st.tuples(U(0, 1), U(0, 1)).flatmap(
        lambda t: U(0, (1 << (32 << t[0])) - 1).map(lambda v: Packet(Kind.PTW, v, t[0], t[1]))
    ),
    U(0, 1).map(lambda i: Packet(Kind.EXSTOP, 0, 0, i)),
    st.tuples(U(0, 0xFFFFFFFF), U(0, 0xFFFFFFFF)).map(lambda t: Packet(Kind.MWAIT, *t)),
    st.tuples(U(0, 15), U(0, 15), U(0, 1)).map(lambda t: Packet(Kind.PWRE, *t)),
    st.tuples(U(0, 15), U(0, 15), st.sampled_from([0, 1, 2, 4, 7])).map(
        lambda t: Packet(Kind.PWRX, *t)
    ),
    st.tuples(U(0, 31), U(0, 255), U(0, 1)).map(lambda t: Packet(Kind.CFE, *t)),
    st.tuples(U(0, (1 << 64) - 1), U(0, 31)).map(lambda t: Packet(Kind.EVD, *t)),
    st.tuples(U(0, 255), U(0, 0xFFFF), U(0, 7)).map(
        lambda t: Packet(Kind.TRIG, t[0], t[1] if t[2] & 2 else 0, t[2])
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PACKETS, max_size=60))
def test_round_trip(packets):
    data = encode(packets)
    table = decode(data, sync=False, resync=False)
    assert table.errors == []
    assert table.packets() == packets
    assert int(table.size.sum()) == len(data)
    assert encode(table) == data


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(U(0, 31), U(0, 1)), max_size=8), st.data())
def test_block_packets_round_trip(blocks, data):
    packets = []
    for btype, sz4 in blocks:
        packets.append(Packet(Kind.BBP, btype, sz4))
        for _ in range(data.draw(U(0, 4))):
            width = 32 if sz4 else 64
            packets.append(
                Packet(Kind.BIP, data.draw(U(0, (1 << width) - 1)), data.draw(U(0, 31)), sz4)
            )
        packets.append(Packet(Kind.BEP, 0, 0, data.draw(U(0, 1))))
        packets.append(Packet(Kind.TNT8, 1, 1))  # a TNT byte outside a block
    table = decode(encode(packets), sync=False, resync=False)
    assert table.packets() == packets


def _psb_plus_end_by_tables(buf: np.ndarray, psb: int, end: int) -> int:
    """The end of the PSB+ at ``psb`` as decoding packet tables of growing
    spans finds it (-1: none, or a packet bad or broken off first)."""
    span = 4096
    while True:
        stop = min(end, psb + span)
        table = decode_range(buf, psb, stop, resync=False)
        hit = np.flatnonzero(table.kind == Kind.PSBEND)
        if len(hit):
            return int(table.offset[hit[0]] + table.size[hit[0]])
        if stop >= end or len(table.err_code):
            return -1
        span *= 4


@settings(max_examples=300, deadline=None)
@given(
    st.lists(PACKETS, max_size=40),
    st.integers(0, 700),
    st.binary(max_size=24),
    st.integers(0, 12),
)
def test_psb_plus_end_is_the_tables_answer(packets, pads, noise, cut):
    """The compiled walk for a PSB+'s end answers as decoding the packets
    into tables over the same growing spans does: past PADs that carry a
    PSB+ over the first span's end, at bad or broken-off packets, and
    without a PSBEND."""
    data = encode([PSB, *packets]) + bytes(pads) + noise + encode([PSBEND])
    buf = np.frombuffer(data[: max(len(data) - cut, 16)], np.uint8)
    for end in (buf.shape[0], min(buf.shape[0], 4096 + 7)):
        want = _psb_plus_end_by_tables(buf, 0, end)
        assert psb_plus_end(buf, 0, end, missing=-1) == want


def test_psb_plus_end_over_spans():
    """A PSB+ whose PSBEND lies past the first 4 KiB is found; one whose
    packet straddles the first span's end is not (as the tables say)."""
    for pads, found in ((5000, True), (4096 - 16 - 3, False), (4096 - 16, True)):
        data = encode([PSB]) + bytes(pads) + encode([Packet(Kind.TSC, 5), PSBEND])
        buf = np.frombuffer(data, np.uint8)
        want = len(data) if found else -1
        assert (
            psb_plus_end(buf, 0, missing=-1) == want == _psb_plus_end_by_tables(buf, 0, len(data))
        )
    data = encode([PSB]) + bytes(5000) + encode([PSBEND])
    assert psb_plus_end(np.frombuffer(data, np.uint8), 0) == len(data)


def test_ip_compression_choices():
    assert compress_ip(0x401234, 0x400000) == (1, 0x1234)
    assert compress_ip(0x7F0012345678, 0x7F00AAAA0000) == (2, 0x12345678)
    assert compress_ip(0xFFFFFFFF81000000, None) == (3, 0xFFFF81000000)
    assert compress_ip(0x00CC_CCCC_CCCC_4000, None) == (6, 0x00CCCCCCCCCC4000)
    assert compress_ip(0x00CC_8000_0000_0000, 0x00CC_0000_0000_0000) == (4, 0x800000000000)


def test_make_and_fields():
    p = Packet.make("tip", ip=0x1000, ipc=6)
    assert p == Packet(Kind.TIP, 0x1000, 6)
    assert p.get("ip") == 0x1000
    assert p.to_dict()["kind"] == "tip"
    with pytest.raises(ValueError):
        Packet.make("tip", cr3=1)


def stream(*groups):
    return encode([PSB, *groups, PSBEND])


def test_sync_forward_and_backward():
    body = encode([Packet(Kind.TNT8, 1, 1)] * 5)
    data = body + stream() + body + stream()
    first = sync_forward(data)
    assert first == len(body)
    second = sync_forward(data, first + 1)
    assert second == 2 * len(body) + 18
    assert sync_backward(data) == second
    assert sync_backward(data, second) == first
    assert sync_forward(b"\x00" * 64) == -1


def test_decode_starts_at_first_psb_and_resyncs():
    good = stream(Packet(Kind.FUP, 0x1000, 6))
    data = b"\xc9\xc9" + good + b"\xc9" + good
    table = decode(data)
    assert table.synced
    assert [p.kind for p in table] == [Kind.PSB, Kind.FUP, Kind.PSBEND] * 2
    [err] = table.errors
    assert err.code == DecodeError.BAD_OPCODE
    assert err.offset == 2 + len(good)
    assert err.index == 3


def test_truncated_packet_keeps_what_came_before():
    data = stream(Packet(Kind.TSC, 5)) + b"\x19\x01\x02"
    table = decode(data)
    assert [p.kind for p in table] == [Kind.PSB, Kind.TSC, Kind.PSBEND]
    [err] = table.errors
    assert err.code == DecodeError.TRUNCATED and err.offset == len(data) - 3


def test_no_psb():
    assert not decode(b"").synced
    assert not decode(bytes(100)).synced
    assert len(decode(bytes(100), sync=False)) == 100  # PADs


def test_erratum_workarounds():
    skz84 = PtConfig()
    skz84.set_cpu(Cpu.parse("6/85"))
    bad_tma = bytes([0x02, 0x73, 1, 1, 1, 1, 0, 0x99])
    data = stream() + bad_tma + encode([Packet(Kind.PAD)])
    assert decode(data).errors[0].code == DecodeError.BAD_PACKET
    kinds = [p.kind for p in decode(data, config=skz84)]
    assert kinds[-2:] == [Kind.INVALID, Kind.PAD]
    skd007 = PtConfig()
    skd007.set_cpu(Cpu.parse("6/78"))
    data = stream() + bytes([0xF7, 0x02, 0xF3, 0x00])
    assert [p.kind for p in decode(data)][-3:] == [Kind.CYC, Kind.CYC, Kind.PAD]
    assert [p.kind for p in decode(data, config=skd007)][-2:] == [Kind.OVF, Kind.PAD]


def test_chunked_and_parallel_decoding_agree(tmp_path):
    rng = np.random.default_rng(7)
    parts = []
    for _ in range(200):
        group = [Packet(Kind.TNT8, int(v), 6) for v in rng.integers(0, 64, 40)]
        group += [Packet(Kind.TIP, int(v), 6) for v in rng.integers(0, 1 << 40, 10)]
        parts.append(stream(Packet(Kind.TSC, 1)) + encode(group))
    data = b"".join(parts)
    path = tmp_path / "t.pt"
    path.write_bytes(data)
    whole = decode(data)
    chunks = list(iter_chunks(path, chunk_bytes=4096))
    assert len(chunks) > 5
    assert sum(len(c) for c in chunks) == len(whole)
    assert psb_chunks(np.frombuffer(data, np.uint8), 4096)[0][0] == 0
    par = decode_file(path, jobs=2, chunk_bytes=4096)
    assert np.array_equal(par.offset, whole.offset)
    assert np.array_equal(par.a, whole.a)
    assert count_packets(path, jobs=2, chunk_bytes=4096) == len(whole)


def test_encode_rejects_impossible_fields():
    with pytest.raises(ValueError, match="cannot be encoded"):
        encode([Packet(Kind.TNT8, 0xFF, 3)])
    with pytest.raises(ValueError):
        encode([Packet(Kind.TIP, 0, 5)])


def _resident_pages() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1])


def test_release_drops_pages_of_a_mapped_file(tmp_path):
    """Reading a large trace front to back keeps only what is in use
    resident: release() unmaps consumed pages of the mapping, also given a
    slice of it."""
    import mmap

    from hwtrace.pt.packets import map_file, release

    path = tmp_path / "t.pt"
    path.write_bytes(bytes(range(256)) * (64 << 10))  # 16 MiB
    buf = map_file(path)
    pages = buf.shape[0] // mmap.PAGESIZE
    assert int(buf[:: mmap.PAGESIZE].astype(np.int64).sum()) >= 0  # touch every page
    before = _resident_pages()
    release(buf[100:], 0, buf.shape[0] - 100)
    assert before - _resident_pages() >= pages - 2


def test_the_frequent_packets_loop_decodes_as_the_general_decoder():
    """decode_stream takes the frequent packets (TNT-8, packets with an IP,
    MODE, CYC, MTC) in a loop of their own: every packet that loop takes,
    whatever its first byte and payload, it decodes as decode_packet does;
    any other it leaves to it."""
    from hwtrace.pt._loops import _plain_packets, decode_packet
    from hwtrace.pt.packets import new_rows

    rng = np.random.default_rng(5)
    taken = set()
    for b0 in range(256):
        for _ in range(12):
            buf = np.concatenate([[b0], rng.integers(0, 256, 15)]).astype(np.uint8)
            rows = new_rows(2)
            pos, n = _plain_packets(buf, 0, 1, buf.shape[0], 100, 0, 2, 0, rows)
            if n == 0:
                assert pos == 0
                continue
            size, kind, a, b, c = decode_packet(buf, 0, buf.shape[0], 0, 0)
            assert (pos, n) == (size, 1), bytes(buf).hex()
            got = tuple(int(col[0]) for col in rows)
            assert got == (100, kind, size, a, b, c), bytes(buf).hex()
            taken.add(Kind(kind).name)
    assert taken == {"TNT8", "TIP", "FUP", "TIP_PGE", "TIP_PGD", "MODE_EXEC", "MODE_TSX",
                     "CYC", "MTC"}  # fmt: skip
