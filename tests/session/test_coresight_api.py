"""The CoreSight capture as a library: ``CoreSightCapture`` gives the
listing and events ``hwtrace csdump`` prints (which the csdump tests hold to
OpenCSD's ``trc_pkt_lister``), and reports damage through ``warn`` with the
place named."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from realdata import real_input

from hwtrace.hwevents.csframes import format_frames
from hwtrace.hwevents.cssnapshot import Buffer, Device, Snapshot, write_snapshot
from hwtrace.hwevents.etm4 import Etm4Config, Etm4Kind, Etm4Packet, encode_etm4
from hwtrace.session.coresight import CoreSightCapture

K, P = Etm4Kind, Etm4Packet
ETM = Etm4Config(trace_id=0x10)


def csdump(*args: str) -> tuple[list[str], str]:
    proc = subprocess.run([sys.executable, "-m", "hwtrace.cli.main", "csdump", *args],
                          capture_output=True, text=True, check=True, timeout=300)  # fmt: skip
    return proc.stdout.splitlines(), proc.stderr


def etm_snapshot(directory, tail: bytes = b""):
    pk = [P(K.ASYNC), P(K.TRACE_INFO), P(K.TRACE_ON),
          P(K.ADDR_CTXT, 0xFFFF_0000_0040_1000, context=0x42, vmid=1, el=1)]  # fmt: skip
    for k in range(20):
        pk += [P(K.ATOMS, atoms=0b1011, natoms=4), P(K.ADDR, 0xFFFF_0000_0040_1000 + 0x40 * k)]
    regs, offsets = ETM.to_regs()
    snap = Snapshot(
        devices=[Device("cpu_0", "Cortex-A57", cls="core"),
                 Device("ETM_0", "ETM4", regs=regs, offsets=offsets)],
        buffers=[Buffer("ETB_0", format_frames([(0x10, encode_etm4(pk, ETM) + tail)]),
                        format="coresight", file="etb.bin")],
        source_buffers={"ETM_0": "ETB_0"},
        core_trace_sources={"cpu_0": "ETM_0"},
    )  # fmt: skip
    return write_snapshot(directory, snap)


def test_snapshot_listing_and_events_are_csdump_s(tmp_path) -> None:
    d = etm_snapshot(tmp_path / "s")
    capture = CoreSightCapture.snapshot(d)
    assert [s.name for s in capture.sources] == ["ETM_0"]
    listing = list(capture.listing())
    assert len(listing) > 40
    assert listing == csdump("--snapshot", str(d))[0]
    at = {0xFFFF_0000_0040_1000: "start"}
    rows = capture.events(at=at)
    assert [r["event"] for r in rows] == ["start"]
    want = csdump("--snapshot", str(d), "--events", "--at", "0xffff000000401000=start")[0]
    assert [f"ETM_0: start {' '.join(f'{k}={v}' for k, v in r.items() if k not in ('source', 'event'))}" for r in rows] == want  # fmt: skip


def test_damage_goes_to_warn_with_its_place(tmp_path) -> None:
    d = etm_snapshot(tmp_path / "s", tail=b"\x00" * 3)  # a cut-off packet at the end
    said: list[str] = []
    capture = CoreSightCapture.snapshot(d, warn=said.append)
    listing = list(capture.listing())
    _, err = csdump("--snapshot", str(d))
    assert said and all(line.startswith("ETM_0: offset 0x") for line in said)
    assert err.splitlines() == [f"hwtrace csdump: {line}" for line in said]
    assert listing == csdump("--snapshot", str(d))[0]


def test_real_snapshot_through_the_library() -> None:
    directory = real_input("opencsd-snapshots") / "juno_r1_1"
    capture = CoreSightCapture.snapshot(directory)
    listing = list(capture.listing())
    assert len(listing) > 1000
    assert listing == csdump("--snapshot", str(directory))[0]


def test_missing_input_is_one_message(tmp_path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        CoreSightCapture.raw(tmp_path / "none.bin", "etm4")
    with pytest.raises(ValueError, match="not one of"):
        CoreSightCapture.raw(tmp_path / "none.bin", "etm3")


def test_listing_in_windows_is_the_whole_listing() -> None:
    """Sources decoded and merged a few packets at a time (the merge waits
    for every source at each index) list exactly what the whole does, in
    pieces of whole lines."""
    directory = real_input("opencsd-snapshots") / "juno_r1_1"
    capture = CoreSightCapture.snapshot(directory)
    assert sum(len(s.data) > 0 for s in capture.sources) > 1
    whole = bytes(capture.listing_text())
    for rows in (1, 5, 300):
        pieces = [bytes(p) for p in capture.listing_chunks(rows)]
        assert len(pieces) > 1
        assert all(p.endswith(b"\n") for p in pieces)
        assert b"".join(pieces) == whole


def test_events_from_windows_are_the_whole_decode_s() -> None:
    """The events of packets decoded a few at a time, keeping only the rows
    events read, are those of the whole decode (every address a trace
    start reaches registered)."""
    from hwtrace.hwevents.etm4 import decode_etm4, event_packets, trace_on_events

    capture = CoreSightCapture.snapshot(real_input("opencsd-snapshots") / "juno_r1_1")
    sources = [s for s in capture.sources if s.protocol != "stm" and len(s.data)]
    assert sources
    for src in sources:
        config = src.etm4_config()
        whole = decode_etm4(src.data, config)
        at = {int(a): f"at{int(a):x}" for a in set(whole.address.tolist())}
        want = trace_on_events(whole, at)
        assert len(want.name) > 0
        for rows in (3, 100):
            got = trace_on_events(event_packets(src.data, config, rows=rows), at)
            assert got.name == want.name
            for col in ("address", "ts", "cc", "context", "el", "offset"):
                np.testing.assert_array_equal(getattr(got, col), getattr(want, col))
