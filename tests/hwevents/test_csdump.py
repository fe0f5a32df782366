"""``hwtrace csdump``: an ETB capture of an ETMv4 and an STM source in
formatter frames, as an OpenCSD snapshot and as a raw file: the packet
listing equals OpenCSD's trc_pkt_lister's, per trace ID; the software
events (ETM trace-on at a registered address, STM messages) come out;
damaged input is one message per problem with the file offset."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from cs_traces import one_point_trace
from opencsd_oracle import LISTER, needs_opencsd

from hwtrace.hwevents.csframes import format_frames
from hwtrace.hwevents.cssnapshot import Buffer, Device, Snapshot, write_snapshot
from hwtrace.hwevents.etm4 import Etm4Config, Etm4Kind, Etm4Packet, encode_etm4
from hwtrace.hwevents.stp import StpKind, StpPacket, encode_stp

K, P = Etm4Kind, Etm4Packet
S = StpKind
FOO = 0xFFFF_0000_0040_1000
ETM_ID, STM_ID = 0x10, 0x20
CFG = Etm4Config(trace_id=ETM_ID)
STMTCSR = (STM_ID << 16) | 0x7
N_FOO = 40
N_MSG = 60


def _etm() -> tuple[bytes, list[int]]:
    pk, times, _ = one_point_trace(CFG, N_FOO, np.random.default_rng(7), foo=FOO, atoms=10)
    return encode_etm4(pk, CFG), times


def _stm() -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """Linux-style messages: a timestamped first write, more data, a FLAG."""
    pk = [StpPacket(S.ASYNC), StpPacket(S.VERSION, 3), StpPacket(S.M8, 3)]
    want, ts = [], 100
    for k in range(N_MSG):
        channel = 5 + k % 3
        ts += 17 + k
        pk += [
            StpPacket(S.C8, channel),
            StpPacket(S.D32, 0x1000 + k, ts=ts),
            StpPacket(S.D16, k),
            StpPacket(S.FLAG),
        ]
        want.append((channel, ts, (0x1000 + k).to_bytes(4, "little") + k.to_bytes(2, "little")))
    return encode_stp(pk), want


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    d = tmp_path_factory.mktemp("csdump")
    etm, times = _etm()
    stm, msgs = _stm()
    chunks, i, j = [], 0, 0
    rng = np.random.default_rng(3)
    while i < len(etm) or j < len(stm):
        a, b = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        chunks += [(ETM_ID, etm[i : i + a]), (STM_ID, stm[j : j + b])]
        i, j = i + a, j + b
    frames = format_frames(chunks)
    (d / "etb.bin").write_bytes(frames)
    regs, offsets = CFG.to_regs()
    snap = Snapshot(
        devices=[Device("cpu_0", CFG.core_name, cls="core"),
                 Device("ETM_0", CFG.device_type, regs=regs, offsets=offsets),
                 Device("STM_0", "STM", regs={"STMTCSR": STMTCSR}, offsets={"STMTCSR": 0x3A0})],
        buffers=[Buffer("ETB_0", frames, format="coresight", file="etb.bin")],
        source_buffers={"ETM_0": "ETB_0", "STM_0": "ETB_0"},
        core_trace_sources={"cpu_0": "ETM_0"},
    )  # fmt: skip
    write_snapshot(d / "snap", snap)
    return d, times, msgs, regs


def _hwtrace(*args: str):
    return subprocess.run([sys.executable, "-m", "hwtrace.cli.main", "csdump", *args],
                          capture_output=True, text=True, check=False)  # fmt: skip


def _by_id(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("Idx:"):
            out.setdefault(line.split(";")[1].strip(), []).append(line.rstrip())
    return out


@needs_opencsd
def test_snapshot_listing_equals_opencsd(capture):
    d, *_ = capture
    got = _hwtrace("--snapshot", str(d / "snap"))
    assert got.returncode == 0 and got.stderr == "", got.stderr
    theirs = subprocess.run([LISTER, "-ss_dir", str(d / "snap"), "-logstdout"], capture_output=True,
                            text=True, cwd=str(d / "snap"), check=False).stdout.splitlines()  # fmt: skip
    mine, ref = _by_id(got.stdout.splitlines()), _by_id(theirs)
    assert set(mine) == {"ID:10", "ID:20"} and set(ref) == set(mine)
    for tid in mine:
        assert mine[tid] == ref[tid], tid
    # The raw file with registers on the command line lists the same.
    raw = _hwtrace(str(d / "etb.bin"), "--frames", "memory", "--protocol", "stm", "--id", "0x20",
                   "--reg", f"STMTCSR={STMTCSR:#x}")  # fmt: skip
    assert raw.returncode == 0, raw.stderr
    assert _by_id(raw.stdout.splitlines())["ID:20"] == ref["ID:20"]
    frames = _hwtrace("--snapshot", str(d / "snap"), "--raw-frames").stdout
    assert "RAW_PACKED" in frames and "ID_DATA[0x10]" in frames


def test_events_from_the_snapshot(capture):
    d, times, msgs, _ = capture
    out = d / "ev.jsonl"
    got = _hwtrace("--snapshot", str(d / "snap"), "--at", f"{FOO:#x}=foo", "--json", str(out))
    assert got.returncode == 0, got.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    foo = [r for r in rows if r["event"] == "foo"]
    assert [r["ts"] for r in foo] == times and {r["context"] for r in foo} == {"0x1092"}
    assert all(r["source"] == "ETM_0" for r in foo)
    stm = [r for r in rows if r["event"] == "stm"]
    assert [(r["channel"], r["ts"], bytes.fromhex(r["payload"])) for r in stm] == msgs
    assert {r["master"] for r in stm} == {3}
    text = _hwtrace("--snapshot", str(d / "snap"), "--events", "--at", f"{FOO:#x}=foo").stdout
    assert text.count("ETM_0: foo ") == N_FOO and text.count("STM_0: stm ") == N_MSG


def test_damage_is_one_message_per_problem(capture, tmp_path):
    d, *_ = capture
    frames = (d / "etb.bin").read_bytes()
    cut = frames[: len(frames) - 5]  # a truncated last frame
    (tmp_path / "cut.bin").write_bytes(cut)
    got = _hwtrace(
        str(tmp_path / "cut.bin"), "--frames", "memory", "--protocol", "etm4", "--id", "0x10"
    )
    assert got.returncode == 0
    assert got.stderr.startswith(f"hwtrace csdump: {tmp_path / 'cut.bin'}: offset ")
    assert "Traceback" not in got.stderr and "I_ASYNC" in got.stdout
    # A stream that never synchronises: every byte skipped, said once (and
    # listed as OpenCSD lists it: not synchronised).
    (tmp_path / "junk.bin").write_bytes(bytes(range(1, 200)) * 3)
    got = _hwtrace(str(tmp_path / "junk.bin"), "--protocol", "stm")
    assert got.returncode == 0 and got.stdout == "Idx:0; ID:0;\tNOTSYNC:STM not synchronised\n"
    assert got.stderr.count("\n") == 1 and "offset 0x0" in got.stderr
    # A trace ID the frames do not carry: said, with those they do (the
    # others are not "unknown": only not asked for).
    got = _hwtrace(str(d / "etb.bin"), "--frames", "memory", "--protocol", "stm", "--id", "0x30")
    assert got.returncode == 1 and got.stdout == ""
    assert got.stderr == (
        f"hwtrace csdump: {d / 'etb.bin'}: no data of trace ID 0x30; its frames carry IDs 0x10, 0x20\n"
    )
    # ... and in a snapshot, with its sources' IDs.
    got = _hwtrace("--snapshot", str(d / "snap"), "--id", "0x30")
    assert got.returncode == 1 and got.stdout == ""
    assert got.stderr == (
        f"hwtrace csdump: {d / 'snap'}: no trace source with trace data is ID 0x30; "
        "the snapshot's: ETM_0 (ID 0x10), STM_0 (ID 0x20)\n"
    )
    missing = _hwtrace(str(tmp_path / "none.bin"), "--protocol", "stm")
    assert (
        missing.returncode == 2
        and missing.stderr
        == f"hwtrace csdump: argument FILE: {tmp_path / 'none.bin'}: no such file\n"
    )
    bad = _hwtrace("--snapshot", str(tmp_path))
    assert (
        bad.returncode == 1
        and bad.stderr.startswith("hwtrace csdump: ")
        and bad.stderr.count("\n") == 1
    )
