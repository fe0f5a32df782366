"""OpenCSD snapshot directories: written and read back whole; damaged
ones are one SnapshotError naming the file, never another exception."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.hwevents.cssnapshot import (
    Buffer,
    Device,
    Snapshot,
    SnapshotError,
    read_snapshot,
    write_snapshot,
)


def _snap() -> Snapshot:
    return Snapshot(
        devices=[Device("cpu_0", "Cortex-A57", cls="core"),
                 Device("ETM_0", "ETM4", regs={"TRCCONFIGR": 0xC1, "TRCTRACEIDR": 0x10},
                        offsets={"TRCCONFIGR": 0x10, "TRCTRACEIDR": 0x40}),
                 Device("STM_0", "STM", regs={"STMTCSR": 0x00200007})],
        buffers=[Buffer("ETB_0", bytes(range(256)) * 4, format="coresight", file="etb.bin"),
                 Buffer("RAW", b"\xff" * 11, format="source_data")],
        source_buffers={"ETM_0": "ETB_0", "STM_0": "RAW"},
        core_trace_sources={"cpu_0": "ETM_0"},
    )  # fmt: skip


def test_round_trip(tmp_path):
    want = _snap()
    got = read_snapshot(write_snapshot(tmp_path / "s", want))
    assert [(d.name, d.type, d.cls, d.regs, d.offsets) for d in got.devices] == [
        (d.name, d.type, d.cls, d.regs, d.offsets) for d in want.devices
    ]
    assert [(b.name, b.data, b.format) for b in got.buffers] == [
        (b.name, b.data, b.format) for b in want.buffers
    ]
    assert got.source_buffers == want.source_buffers
    assert got.core_trace_sources == want.core_trace_sources
    assert got.source_data("STM_0").data == b"\xff" * 11
    assert (tmp_path / "s" / "device_1.ini").read_text().count("TRCCONFIGR(0x010)=0x000000C1") == 1


def test_damage_names_the_file(tmp_path):
    root = write_snapshot(tmp_path / "s", _snap())
    with pytest.raises(SnapshotError, match=r"snapshot\.ini"):
        read_snapshot(tmp_path / "missing")
    (root / "device_1.ini").write_text("[device]\nname=ETM_0\n[regs]\nTRCCONFIGR(zz)=1\n")
    with pytest.raises(SnapshotError, match=r"device_1.ini: register 'TRCCONFIGR\(zz\)'"):
        read_snapshot(root)
    (root / "device_1.ini").write_text("[device]\nname=ETM_0\n[regs]\nTRCCONFIGR=banana\n")
    with pytest.raises(SnapshotError, match=r"device_1\.ini: TRCCONFIGR: 'banana' is not a number"):
        read_snapshot(root)
    write_snapshot(root, _snap())
    (root / "etb.bin").unlink()
    with pytest.raises(SnapshotError, match=r"trace.ini: \[buffer0\] file 'etb.bin'"):
        read_snapshot(root)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from(["snapshot.ini", "device_0.ini", "device_1.ini", "trace.ini"]),
       st.text(max_size=300))  # fmt: skip
def test_garbage_is_a_snapshot_error(tmp_path, name, text):
    root = write_snapshot(tmp_path / "g", _snap())
    (root / name).write_text(text)
    try:
        read_snapshot(root)
    except SnapshotError as e:
        assert str(e)


def test_ds5_register_keys(tmp_path):
    """DS-5 writes ``NAME(id:0xN)`` (the register number: offset 4N),
    ``NAME(size:64)`` and both; OpenCSD reads a register by its name."""
    d = write_snapshot(tmp_path / "s", _snap())
    (d / "device_1.ini").write_text(
        "[device]\nname=ETM_0\nclass=trace_source\ntype=ETM4.1\n\n[regs]\n"
        "TRCCONFIGR(id:0x4)=0x000000C1\nTRCTRACEIDR(id:0x10)=0x10\n"
        "TRCACVR0(id:0x100,size:64)=0xFFFF000000401000\nPC(size:64)=0x0000000000401000\n"
        "TRCIDR0(0x1E0)=0x28000EA1\nCPSR='0x3C5'\n"
    )
    dev = read_snapshot(d).device("ETM_0")
    assert dev.type == "ETM4.1"
    assert dev.regs == {"TRCCONFIGR": 0xC1, "TRCTRACEIDR": 0x10, "TRCACVR0": 0xFFFF000000401000,
                        "PC": 0x401000, "TRCIDR0": 0x28000EA1, "CPSR": 0x3C5}  # fmt: skip
    assert dev.offsets == {"TRCCONFIGR": 0x10, "TRCTRACEIDR": 0x40, "TRCACVR0": 0x400,
                           "TRCIDR0": 0x1E0}  # fmt: skip
    for bad in ("X(id:zz)=1", "X(id)=1", "X(size:64,:3)=1", "X(0x1)(0x2)=1"):
        (d / "device_1.ini").write_text(f"[device]\nname=ETM_0\ntype=ETM4\n[regs]\n{bad}\n")
        with pytest.raises(SnapshotError, match=r"device_1\.ini: register"):
            read_snapshot(d)
