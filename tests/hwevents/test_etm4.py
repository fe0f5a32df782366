"""ETMv4 / ETE packets: hwtrace's encoder and compiled decoder against
OpenCSD's trc_pkt_lister, the one-point tracer's events, damaged input."""

from __future__ import annotations

import numpy as np
import pytest
from cs_traces import one_point_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opencsd_oracle import list_core_source, needs_opencsd

from hwtrace.hwevents.etm4 import (
    ADDRESS_KINDS,
    Etm4Config,
    Etm4Error,
    Etm4Kind,
    Etm4Packet,
    decode_etm4,
    encode_etm4,
    etm4_dump_lines,
    etm4_windows,
    trace_on_events,
)

K = Etm4Kind
P = Etm4Packet
ASYNC = bytes(11) + b"\x80"
ETM4 = Etm4Config()
ETE = Etm4Config(ete=True, arch_major=5, arch_minor=0, cycle_counting=True)
ETE13 = Etm4Config(ete=True, arch_major=5, arch_minor=3)


def lister_lines(tmp_path, data: bytes, cfg: Etm4Config) -> list[str]:
    regs, offsets = cfg.to_regs()
    rows = list_core_source(tmp_path, data, cfg.device_type, regs, offsets, cfg.core_name)
    return [f"Idx:{r.idx}; ID:{r.id:x};\t{r.name} :{r.text}" for r in rows]


def agree(tmp_path, data: bytes, cfg: Etm4Config) -> list[str]:
    dec = decode_etm4(data, cfg)
    mine = list(etm4_dump_lines(data, dec, ete=cfg.ete))
    theirs = lister_lines(tmp_path, data, cfg)
    assert len(theirs) == len(mine)
    for a, b in zip(mine, theirs, strict=True):
        assert a == b
    return mine


# ------------------------------------------------------------------ config


def test_config_registers_round_trip():
    for cfg in (ETM4, ETE, ETE13, Etm4Config(vmid_size=32, cid_size=0, arch_minor=1, cc_size=20)):
        regs, offsets = cfg.to_regs()
        assert offsets["TRCIDR0"] == 0x1E0 and offsets["TRCCONFIGR"] == 0x010
        back = Etm4Config.from_regs(regs)
        for f in ("ete", "arch_major", "arch_minor", "vmid_size", "cid_size", "cc_size", "ia_64"):
            assert getattr(back, f) == getattr(cfg, f), f
    # a Juno-like A57 ETMv4.0: 8-bit VMID, 32-bit context ID, 64-bit addresses
    juno = {"TRCCONFIGR": 0xC1, "TRCTRACEIDR": 0x10, "TRCIDR0": 0x28000EA1,
            "TRCIDR1": 0x4100F403, "TRCIDR2": 0x00000488, "TRCIDR8": 0}  # fmt: skip
    c = Etm4Config.from_regs(juno)
    assert (c.ete, c.arch_major, c.arch_minor, c.vmid_size, c.cid_size, c.trace_id) == (
        False, 4, 0, 8, 32, 0x10,
    )  # fmt: skip
    with pytest.raises(Etm4Error):
        Etm4Config.from_regs({"TRCIDR0": 0})


# ------------------------------------------------------------------ hand vectors

HAND = (
    ASYNC
    + bytes([0x01, 0x00])  # trace info, no sections
    + bytes([0x04])  # trace on
    + bytes([0x9D, 0x40, 0x02, 0, 0, 0x11, 0x22, 0x33, 0x44])  # long 64 IS0
    + bytes([0xF7, 0xDB])  # atoms E, EE
    + bytes([0x02, 0x85, 0x01])  # timestamp 0x85
    + bytes([0x95, 0x22])  # short IS0: bits 8:2 = 0x22
    + bytes([0x80])  # context: same
    + bytes([0x81, 0xC3, 0x11, 0x22, 0x33, 0x44, 0x01])  # EL3, VMID 0x11, CID 0x01443322
    + bytes([0x03, 0x03, 0x05])  # timestamp low 7 bits = 3, CC 5
    + bytes([0x90])  # exact match 0
    + bytes([0x71])  # event 1
    + bytes([0x00, 0x03])  # discard
    + bytes([0xC0, 0xE5])  # atom F6: EEEE, EEEEEEEEN
    + bytes([0x06, 0x06])  # exception: trap
)


def test_hand_vector_fields():
    d = decode_etm4(HAND, ETM4)
    assert d.errors == []
    kinds = [K(int(k)) for k in d.kind]
    assert kinds == [
        K.ASYNC, K.TRACE_INFO, K.TRACE_ON, K.ADDR_L_64IS0, K.ATOM_F1, K.ATOM_F2, K.TIMESTAMP,
        K.ADDR_S_IS0, K.CTXT, K.CTXT, K.TIMESTAMP, K.ADDR_MATCH, K.EVENT, K.DISCARD,
        K.ATOM_F6, K.ATOM_F6, K.EXCEPT,
    ]  # fmt: skip
    assert list(d.offset[:5]) == [0, 12, 14, 15, 24]
    assert int(d.address[3]) == 0x4433221100000500
    assert int(d.address[7]) == 0x4433221100000488
    assert (int(d.atoms[5]), int(d.natoms[5])) == (3, 2)
    assert int(d.ts[6]) == 0x85 and int(d.ts[10]) == 0x83 and int(d.cc[10]) == 5
    assert (int(d.context[9]), int(d.vmid[9]), int(d.el[9])) == (0x01443322, 0x11, 3)
    assert int(d.address[11]) == 0x4433221100000488 and int(d.info[11]) == 0
    assert int(d.event[12]) == 1
    assert (int(d.atoms[15]), int(d.natoms[15])) == (0xFF, 9)
    assert int(d.info[16]) == 3  # trap


@needs_opencsd
def test_hand_vector_agrees_with_opencsd(tmp_path):
    lines = agree(tmp_path, HAND, ETM4)
    assert lines[7].endswith("Addr=0x4433221100000488 ~[0x88]")
    assert "CID=0x01443322; VMID=0x0011; " in lines[9]


# ------------------------------------------------------------------ random sequences


def packets_strategy(cfg: Etm4Config, max_size: int = 120):
    """Valid packet sequences: A-sync and trace info first, then any mix."""
    addr64 = st.integers(0, (1 << 62) - 1).map(lambda a: a & ~3)
    near = st.integers(0, 1 << 20).map(lambda a: 0xFFFF_8000_0000_0000 | (a << 2))
    addr = st.one_of(addr64, near, st.integers(0, 1 << 30).map(lambda a: a << 2))
    ctx = st.builds(
        P, st.just(K.CTXT), el=st.integers(0, 3), sf=st.booleans(), ns=st.booleans(),
        context=st.one_of(st.none(), st.integers(0, (1 << 32) - 1)),
        vmid=st.one_of(st.none(), st.integers(0, 255)),
    )  # fmt: skip
    atom_run = st.integers(1, 30).flatmap(
        lambda n: st.builds(
            P, st.just(K.ATOMS), atoms=st.integers(0, (1 << n) - 1), natoms=st.just(n)
        )
    )
    one = st.one_of(
        st.builds(P, st.just(K.ADDR), addr, isa=st.just(0)),
        st.builds(P, st.just(K.ADDR), addr.map(lambda a: a & ~1 | 2), isa=st.just(1)),
        st.builds(P, st.sampled_from([K.ADDR_CTXT]), addr, el=st.integers(0, 3),
                  sf=st.booleans(), ns=st.booleans(),
                  context=st.one_of(st.none(), st.integers(0, (1 << 32) - 1)),
                  vmid=st.one_of(st.none(), st.integers(0, 255))),
        ctx,
        st.just(P(K.CTXT, el=-1)),
        atom_run,
        st.builds(P, st.just(K.ATOM_F4), atoms=st.sampled_from([0xE, 0, 0xA, 0x5]), natoms=st.just(4)),
        st.builds(P, st.just(K.ATOM_F5), atoms=st.sampled_from([0x1E, 0, 0xA, 0x15]), natoms=st.just(5)),
        st.builds(P, st.just(K.TIMESTAMP), ts=st.integers(0, (1 << 56) - 1),
                  cc=st.one_of(st.just(-1), st.integers(0, 4095))),
        st.just(P(K.TRACE_ON)),
        st.builds(P, st.just(K.EVENT), event=st.integers(1, 15)),
        st.builds(P, st.just(K.EXCEPT), info=st.integers(1, 15), payload=st.integers(0, 3)),
        st.sampled_from([P(K.DISCARD), P(K.OVERFLOW), P(K.MISPREDICT), P(K.MISPREDICT, atoms=1, natoms=1)]),
        st.builds(P, st.sampled_from([K.COMMIT, K.CANCEL_F1, K.CANCEL_F1_MISPRED]), info=st.integers(0, 1000)),
        st.builds(P, st.just(K.CANCEL_F3), info=st.integers(2, 5), natoms=st.integers(0, 1), atoms=st.just(1)),
        st.builds(P, st.just(K.TRACE_INFO), info=st.sampled_from([0, 1]), cc=st.integers(0, 500)),
        st.builds(P, st.just(K.CCNT_F3), cc=st.integers(0, 3), info=st.integers(1, 4)),
        st.builds(P, st.just(K.CCNT_F1), cc=st.integers(-1, 5000), info=st.integers(0, 50)),
        *(
            [st.sampled_from([P(K.TS_MARKER), P(K.TRANS_ST), P(K.TRANS_COMMIT), P(K.PE_RESET),
                              P(K.TRANS_FAIL), P(K.IGNORE)]),
             st.builds(P, st.just(K.SRC_ADDR), addr, isa=st.just(0))]
            if cfg.ete else [st.just(P(K.EXCEPT_RTN))]
        ),
    )  # fmt: skip
    return st.lists(one, min_size=1, max_size=max_size).map(
        lambda ps: [P(K.ASYNC), P(K.TRACE_INFO)] + _fix_ccnt(ps)
    )


def _fix_ccnt(ps: list[Etm4Packet]) -> list[Etm4Packet]:
    """Cycle counts are relative to the latest trace info's threshold."""
    thr = 0
    out = []
    for p in ps:
        if p.kind == K.TRACE_INFO:
            thr = p.cc if p.info & 1 else 0
        elif p.kind in (K.CCNT_F1, K.CCNT_F3) and p.cc >= 0:
            p = P(p.kind, cc=p.cc + thr, info=p.info if p.kind == K.CCNT_F1 else max(p.info, 1))
        out.append(p)
    return out


def expect_rows(packets: list[Etm4Packet], data: bytes, cfg: Etm4Config) -> None:
    """The decoder gives back what was encoded, packet for packet."""
    d = decode_etm4(data, cfg)
    assert d.errors == []
    rows = [d.packet(i) for i in range(len(d))]
    atomic = (K.ATOMS, K.ATOM_F1, K.ATOM_F2, K.ATOM_F3, K.ATOM_F4, K.ATOM_F5, K.ATOM_F6)

    def flat(ps):
        out = []
        for p in ps:
            if p.kind in atomic:
                out.extend(("atom", (p.atoms >> j) & 1) for j in range(p.natoms))
            else:
                out.append(p)
        return out

    want, got = flat(packets), flat(rows)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, tuple):
            assert g == w
            continue
        if w.kind in (K.ADDR, K.SRC_ADDR, K.ADDR_CTXT):
            assert g.kind in ADDRESS_KINDS
            assert (g.address, g.isa) == (w.address, w.isa)
            if w.kind == K.ADDR_CTXT:
                assert (g.el, g.sf, g.ns, g.context, g.vmid) == (
                    w.el,
                    w.sf,
                    w.ns,
                    w.context,
                    w.vmid,
                )
            continue
        assert g.kind == w.kind
        if w.kind == K.TIMESTAMP:
            assert (g.ts, g.cc) == (w.ts, w.cc)
        elif w.kind in (K.ATOM_F4, K.ATOM_F5):
            assert (g.atoms, g.natoms) == (w.atoms, w.natoms)
        elif w.kind == K.CTXT and w.el != -1:
            assert (g.el, g.sf, g.ns, g.context, g.vmid) == (w.el, w.sf, w.ns, w.context, w.vmid)
        elif w.kind == K.EVENT:
            assert g.event == w.event
        elif w.kind in (K.EXCEPT, K.COMMIT, K.CANCEL_F1, K.CANCEL_F1_MISPRED, K.CANCEL_F3):
            assert g.info == w.info
        elif w.kind == K.TRACE_INFO:
            assert (g.info, g.cc) == (w.info, w.cc if w.info & 1 else -1)
        elif w.kind in (K.CCNT_F1, K.CCNT_F3):
            assert g.cc == (w.cc if w.kind != K.CCNT_F1 or w.cc >= 0 else 0)


SLOW = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                          HealthCheck.too_slow, HealthCheck.data_too_large]
)  # fmt: skip


@needs_opencsd
@SLOW
@given(seqs=st.lists(packets_strategy(ETM4), min_size=1, max_size=6))
def test_random_etm4_round_trip_and_opencsd(tmp_path, seqs):
    data = b""
    for s in seqs:
        piece = encode_etm4(s, ETM4)
        expect_rows(s, piece, ETM4)
        data += piece
    agree(tmp_path, data, ETM4)


@needs_opencsd
@SLOW
@given(seqs=st.lists(packets_strategy(ETE), min_size=1, max_size=6))
def test_random_ete_round_trip_and_opencsd(tmp_path, seqs):
    data = b""
    for s in seqs:
        piece = encode_etm4(s, ETE)
        expect_rows(s, piece, ETE)
        data += piece
    agree(tmp_path, data, ETE)


# ------------------------------------------------------------------ long stream and the one-point tracer


def test_one_point_tracer_events():
    foo = 0xFFFF_0000_0040_1000
    pk, times, _ = one_point_trace(ETM4, 300, np.random.default_rng(1), foo=foo, resync_every=64)
    data = encode_etm4(pk, ETM4)
    d = decode_etm4(data, ETM4)
    assert d.errors == []
    ev = trace_on_events(d, {foo: "foo"})
    assert len(ev) == 300
    assert ev.name == ["foo"] * 300
    assert list(ev.ts) == times
    assert set(ev.context.tolist()) == {4242}
    assert all(int(a) == foo for a in ev.address)
    # the offsets are the address packets after the trace-ons
    assert all(d.kind[np.searchsorted(d.offset, o)] in ADDRESS_KINDS for o in ev.offset)
    assert len(trace_on_events(d, {foo + 4: "bar"})) == 0


def test_ite_payload_events():
    foo = 0x40_1000
    pk = [P(K.ASYNC), P(K.TRACE_INFO), P(K.TRACE_ON), P(K.ADDR, foo), P(K.ITE, el=1, payload=0xDEADBEEF12345678),
          P(K.TIMESTAMP, ts=99), P(K.ITE, el=0, payload=7)]  # fmt: skip
    d = decode_etm4(encode_etm4(pk, ETE13), ETE13)
    assert d.errors == []
    ev = trace_on_events(d, {foo: "foo"})
    assert ev.name == ["foo", "ITE", "ITE"]
    assert list(ev.payload) == [0, 0xDEADBEEF12345678, 7]
    assert list(ev.el[1:]) == [1, 0]
    assert list(ev.ts) == [99, 99, -1]
    # without FEAT_ITE the header is reserved
    d0 = decode_etm4(encode_etm4(pk, ETE13), ETE)
    assert d0.errors and d0.errors[0][1] == "reserved packet header"


@needs_opencsd
def test_long_stream_agrees_with_opencsd(tmp_path):
    pk, _, _ = one_point_trace(ETM4, 6000, np.random.default_rng(3), resync_every=64)
    data = encode_etm4(pk, ETM4)
    assert len(data) > 100_000
    lines = agree(tmp_path, data, ETM4)
    assert len(lines) > 20_000


# ------------------------------------------------------------------ damage


def test_truncated_stream():
    data = HAND[:-1]  # the exception packet loses its second byte
    d = decode_etm4(data, ETM4)
    assert d.errors == [(len(HAND) - 2, "incomplete packet at end of trace")]
    assert K(int(d.kind[-1])) == K.INCOMPLETE_EOT
    assert len(d) == 17


def test_never_syncs():
    d = decode_etm4(bytes(range(1, 200)), ETM4)
    assert d.errors == [(0, "no A-sync found")]
    assert [K(int(k)) for k in d.kind] == [K.NOT_SYNC]


def test_data_before_sync_is_skipped():
    d = decode_etm4(b"\xf7\x12\x34" + HAND, ETM4)
    assert d.errors == [(0, "data before the first A-sync skipped")]
    assert int(d.offset[1]) == 3 and K(int(d.kind[1])) == K.ASYNC


def test_corrupt_packet_resyncs_at_next_async():
    good = encode_etm4([P(K.ASYNC), P(K.TRACE_INFO), P(K.TRACE_ON), P(K.ADDR, 0x1000)], ETM4)
    g = len(good)
    # a reserved header (08) then atoms that are lost until the next A-sync,
    # then a bad extension packet (00 07)
    bad = good + bytes([0x08, 0xF7, 0xF7]) + good + bytes([0x00, 0x07]) + good
    d = decode_etm4(bad, ETM4)
    assert d.errors == [
        (g, "reserved packet header"),
        (g + 1, "data before the first A-sync skipped"),
        (2 * g + 3, "bad extension packet"),
    ]
    kinds = [K(int(k)) for k in d.kind]
    assert kinds.count(K.ASYNC) == 3 and kinds.count(K.ADDR_S_IS0) == 3
    assert [int(o) for o, k in zip(d.offset, kinds, strict=True) if k == K.ASYNC] == [
        0,
        g + 3,
        2 * g + 5,
    ]
    lines = list(etm4_dump_lines(bad, d))
    assert lines[4].endswith("I_RESERVED : Reserved Packet Header")
    assert lines[10].endswith("I_BAD_SEQUENCE : Invalid Sequence in packet.[I_EXTENSION]")
    # a damaged A-sync: 13 zero bytes while in sync
    d2 = decode_etm4(good + bytes(13) + b"\x80" + good, ETM4)
    assert d2.errors[0] == (g, "bad A-sync sequence")
    assert [K(int(k)) for k in d2.kind].count(K.ADDR_S_IS0) == 2


def test_windows_carry_the_decoder_on():
    """Packets taken a few at a time are the whole decode's, row for row,
    each window's damage with it (random bytes: damage of every kind)."""
    rng = np.random.default_rng(11)
    good = encode_etm4([P(K.ASYNC), P(K.TRACE_INFO), P(K.TRACE_ON), P(K.ADDR, 0x1000)], ETM4)
    for cfg in (ETM4, ETE):
        raw = rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
        for data in (good + raw + good, ASYNC + raw + b"\x00\x00"):
            for resync in (True, False):
                whole = decode_etm4(data, cfg, resync=resync)
                for rows in (1, 3, 64):
                    parts = list(etm4_windows(data, cfg, resync=resync, rows=rows))
                    assert all(0 < len(p) <= rows for p in parts)
                    assert [e for p in parts for e in p.errors] == whole.errors
                    for name in ("offset", "kind", "address", "atoms", "ts", "info", "payload"):
                        got = np.concatenate([getattr(p, name) for p in parts])
                        assert np.array_equal(got, getattr(whole, name)), name


def test_random_bytes_never_raise():
    rng = np.random.default_rng(7)
    for cfg in (ETM4, ETE, ETE13):
        for n in (0, 1, 5, 100, 5000):
            raw = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            for data in (raw, ASYNC + raw, ASYNC + b"\x01\x00" + raw):
                d = decode_etm4(data, cfg)
                assert len(d) >= (1 if n else 0)
                assert np.all(np.diff(d.offset) > 0)
                list(etm4_dump_lines(data, d, ete=cfg.ete))


def test_encoder_rejects_what_the_format_cannot_carry():
    with pytest.raises(Etm4Error) as e:
        encode_etm4([P(K.ASYNC), P(K.TRACE_INFO), P(K.ATOM_F4, atoms=0x3, natoms=4)], ETM4)
    assert e.value.offset == 2
    with pytest.raises(Etm4Error):
        encode_etm4([P(K.ASYNC), P(K.TRACE_INFO), P(K.ADDR_MATCH, 0x1234, info=0)], ETM4)
    with pytest.raises(Etm4Error):
        encode_etm4([P(K.EVENT, event=0)], ETM4)


# ------------------------------------------------------------------ as OpenCSD lists damage


def agree_through_damage(tmp_path, data: bytes, cfg: Etm4Config) -> list[str]:
    """Decoded without resynchronisation (OpenCSD's packet processor stays
    in sync after a bad header), the dump is the lister's line for line."""
    dec = decode_etm4(data, cfg, resync=False)
    mine = list(etm4_dump_lines(data, dec, ete=cfg.ete))
    assert mine == lister_lines(tmp_path, data, cfg)
    return mine


ETM4Q = Etm4Config(q_elements=True)


def _q_stream(cfg: Etm4Config) -> bytes:
    base = 0xFFFF_0000_0040_1000
    pk = [P(K.ASYNC), P(K.TRACE_INFO), P(K.TRACE_ON),
          P(K.ADDR_CTXT, base, context=7, vmid=1, el=1),
          P(K.ADDR, base + 0x40), P(K.ADDR, base + 0x1000),
          P(K.Q, base + 0x40, info=5, payload=1),  # exact match, entry 1
          P(K.Q, base + 0xA0, info=300, payload=0x5),  # short IS0, one byte
          P(K.Q, base + 0x7A0, info=2, payload=0x5),  # short IS0, two bytes
          P(K.Q, base + 0x2_0000, info=9, payload=0xA),  # long 32-bit IS0
          P(K.Q, base + 0x2_0000, info=4, payload=0),  # exact match, entry 0 (a long one)
          P(K.Q, info=7, payload=0xC),  # count only
          P(K.Q, info=-1, payload=0xF),  # neither
          P(K.ATOMS, atoms=1, natoms=1)]  # fmt: skip
    return encode_etm4(pk, cfg)


def test_q_packets():
    data = _q_stream(ETM4Q)
    d = decode_etm4(data, ETM4Q)
    assert d.errors == []
    q = np.flatnonzero(d.kind == K.Q)
    assert [int(d.payload[i]) for i in q] == [1, 5, 5, 0xA, 0, 0xC, 0xF]
    assert [int(d.info[i]) for i in q][:6] == [5, 300, 2, 9, 4, 7]
    assert [hex(int(d.address[i])) for i in q][:5] == [
        "0xffff000000401040", "0xffff0000004010a0", "0xffff0000004017a0", "0xffff000000421000",
        "0xffff000000421000",
    ]  # fmt: skip
    lines = list(etm4_dump_lines(data, d))
    # an exact match shows the bits its entry's packet carried (a short one)
    assert lines[q[0]].endswith("I_Q : Q Packet.; Count(5); [1]; Addr=0xFFFF000000401040 ~[0x40]")
    assert lines[q[3]].endswith("Count(9); Addr=0xFFFF000000421000 ~[0x421000]")
    assert lines[q[4]].endswith("Count(4); [0]; Addr=0xFFFF000000421000 ~[0x421000]")
    assert lines[q[6]].endswith("I_Q : Q Packet.; Count(Unknown)")
    # Without Q elements (TRCIDR0.QSUPP = 0) the headers are reserved.
    plain = decode_etm4(data, ETM4, resync=False)
    assert K.Q not in plain.kind and K.RESERVED in plain.kind
    with pytest.raises(Etm4Error):
        encode_etm4([P(K.Q, info=1, payload=0xC)], ETM4)
    with pytest.raises(Etm4Error):
        encode_etm4([P(K.Q, info=1, payload=0x3)], ETM4Q)  # a reserved form


@needs_opencsd
def test_q_packets_agree_with_opencsd(tmp_path):
    lines = agree_through_damage(tmp_path, _q_stream(ETM4Q), ETM4Q)
    assert sum("I_Q : Q Packet." in x for x in lines) == 7


def _reserved_cfg_stream() -> bytes:
    """ETE: 07 (an ETMv4 exception return) and a conditional-trace header
    (43) are reserved for its configuration, 08 and 62 are reserved."""
    good = encode_etm4([P(K.ASYNC), P(K.TRACE_INFO), P(K.TRACE_ON), P(K.ADDR, 0x1000)], ETE)
    return good + bytes([0x07, 0xF7, 0x43, 0xF6, 0x08, 0x62, 0xF7]) + good


def test_reserved_for_the_configuration_names_the_packet():
    data = _reserved_cfg_stream()
    d = decode_etm4(data, ETE, resync=False)
    lines = list(etm4_dump_lines(data, d, ete=True))
    tail = [x.split("\t")[1] for x in lines[4:11]]
    assert tail == [
        "I_RESERVED_CFG : Reserved header for current configuration.[I_EXCEPT_RTN]",
        "I_ATOM_F1 : Atom format 1.; E",
        "I_RESERVED_CFG : Reserved header for current configuration.[I_COND_FLUSH]",
        "I_ATOM_F1 : Atom format 1.; N",
        "I_RESERVED : Reserved Packet Header",
        "I_RESERVED : Reserved Packet Header",
        "I_ATOM_F1 : Atom format 1.; E",
    ]
    assert [m for _, m in d.errors] == ["reserved header for this configuration"] * 2 + [
        "reserved packet header"
    ] * 2


@needs_opencsd
def test_reserved_for_the_configuration_agrees_with_opencsd(tmp_path):
    agree_through_damage(tmp_path, _reserved_cfg_stream(), ETE)


# A packet cut by the end of the trace, and what OpenCSD calls it.
_CUTS = (
    (bytes([0x9A, 0x40, 0x02]), "I_ADDR_L_32IS0"),
    (bytes([0x85, 0x40, 0x02, 0, 0]), "I_ADDR_CTXT_L_64IS0"),
    (bytes([0x02, 0x85]), "I_TIMESTAMP"),
    (bytes([0x01]), "I_TRACE_INFO"),
    (bytes([0x00]), "I_EXTENSION"),
    (bytes([0x00, 0x00, 0x00]), "I_ASYNC"),
)


@pytest.mark.parametrize("tail,name", _CUTS)
def test_incomplete_packet_names_what_it_was(tail, name):
    data = HAND + tail
    d = decode_etm4(data, ETM4)
    assert K(int(d.kind[-1])) == K.INCOMPLETE_EOT and int(d.offset[-1]) == len(HAND)
    last = list(etm4_dump_lines(data, d))[-1]
    assert last.endswith(f"I_INCOMPLETE_EOT : Incomplete packet at end of trace.[{name}]")


@needs_opencsd
@pytest.mark.parametrize("tail,name", _CUTS)
def test_incomplete_packet_agrees_with_opencsd(tmp_path, tail, name):
    agree_through_damage(tmp_path, HAND + tail, ETM4)


def _reference_events(packets, addresses):
    """trace_on_events' rules in numpy, row sets at a time: the first
    address packet after each start (before the next one), registered;
    every ITE; each event's first timestamp before the next start."""
    kind = packets.kind
    is_addr = (kind >= K.ADDR_CTXT_L_32IS0) & (kind <= K.ADDR_L_64IS1)
    starts = np.flatnonzero((kind == K.TRACE_ON) | (kind == K.TRACE_INFO))
    addr_rows, ts_rows = np.flatnonzero(is_addr), np.flatnonzero(kind == K.TIMESTAMP)

    def next_row(rows, at, none):
        j = np.searchsorted(rows, at, side="right")
        return np.where(j < rows.shape[0], rows[np.minimum(j, max(rows.shape[0] - 1, 0))], none)

    first = next_row(addr_rows, starts, -1) if addr_rows.size else np.full(starts.size, -1)
    first = first[(first >= 0) & (first < np.append(starts[1:], len(kind)))]
    first = np.unique(first)
    first = first[np.isin(packets.address[first], np.array(sorted(addresses), np.uint64))]
    rows = np.sort(np.concatenate([first, np.flatnonzero(kind == K.ITE)]))
    trow = next_row(ts_rows, rows, -1) if ts_rows.size else np.full(rows.size, -1)
    until = next_row(starts, rows, len(kind)) if starts.size else np.full(rows.size, len(kind))
    ts = np.where(
        (trow >= 0) & (trow < until), packets.ts[np.maximum(trow, 0)].astype(np.int64), -1
    )
    names = ["ITE" if kind[r] == K.ITE else addresses[int(packets.address[r])] for r in rows]
    return rows, names, ts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.integers(0, 1 << 40)),
                max_size=200))  # fmt: skip
def test_trace_on_events_follow_their_rules(rows):
    """The compiled pass over the packets finds the events the rules,
    applied with numpy to whole row sets, find (random packet orders:
    starts without addresses, addresses without starts, timestamps
    before, between and after)."""
    import dataclasses

    from hwtrace.hwevents.etm4 import Etm4Packets

    kinds = [K.TRACE_ON, K.TRACE_INFO, K.TIMESTAMP, K.ITE, K.ADDR_L_64IS0, K.ADDR_CTXT_L_32IS0,
             K.ATOM_F1]  # fmt: skip
    addrs = [0x1000, 0x2000, 0x3000, 0x4000]
    n = len(rows)
    empty = decode_etm4(b"", ETM4)  # (the columns' types)
    cols = {f.name: np.zeros(n, getattr(empty, f.name).dtype)
            for f in dataclasses.fields(Etm4Packets) if f.name != "errors"}  # fmt: skip
    cols["kind"][:] = [kinds[k] for k, _, _ in rows]
    cols["address"][:] = [addrs[a] for _, a, _ in rows]
    cols["ts"][:] = [t for _, _, t in rows]
    cols["offset"][:] = np.arange(n)
    packets = Etm4Packets(**cols, errors=[])
    registered = {0x1000: "foo", 0x3000: "bar"}
    ev = trace_on_events(packets, registered)
    want_rows, want_names, want_ts = _reference_events(packets, registered)
    assert ev.offset.tolist() == want_rows.tolist()
    assert ev.name == want_names
    assert ev.ts.tolist() == want_ts.tolist()
