"""hwtrace ptdump on good and bad input, as a user runs it."""

import json
import subprocess
import sys

import pytest

from hwtrace.pt.kinds import Kind
from hwtrace.pt.packets import Packet, encode


def run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "hwtrace.cli.main", "ptdump", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


def no_traceback(r):
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout


GOOD = encode(
    [
        Packet(Kind.PSB),
        Packet(Kind.TSC, 0x1000),
        Packet(Kind.FUP, 0x401000, 3),
        Packet(Kind.PSBEND),
        Packet(Kind.TNT8, 0b101, 3),
        Packet(Kind.TIP, 0x2000, 1),
    ]
)


def test_dump(tmp_path):
    f = tmp_path / "a.pt"
    f.write_bytes(GOOD)
    r = run(f)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "0000000000000000  psb"
    assert lines[-2].split() == ["0000000000000021", "tnt.8", "!.!"]
    assert lines[-1].split() == ["0000000000000022", "tip", "1:", "????????????2000"]


def test_time_and_range_and_json(tmp_path):
    f = tmp_path / "a.pt"
    f.write_bytes(b"\x00\x00" + GOOD)
    r = run("--time", f"{f}:2")
    assert r.returncode == 0
    assert "tsc 1000 tsc 0000000000001000" in " ".join(r.stdout.split())
    r = run("--json", f)
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert rows[1] == {"offset": 18, "size": 8, "kind": "tsc", "tsc": 0x1000}
    r = run("--json", "--time", f)
    assert json.loads(r.stdout.splitlines()[1])["time"] == 0x1000
    r = run("--human", f)
    assert r.stdout.splitlines()[1].split() == ["0000000000000012", "tsc", "tsc=0x1000"]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read"),
        (b"", "empty"),
        (bytes(4096), "no PSB"),
        (bytes(range(256)) * 8, "no PSB"),
    ],
)
def test_nothing_decodable_exits_2(tmp_path, content, message):
    f = tmp_path / "x.pt"
    if content is not None:
        f.write_bytes(content)
    r = run(f)
    no_traceback(r)
    assert r.returncode == 2
    assert message in r.stderr
    assert str(f) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_errors_name_offsets_and_keep_packets(tmp_path):
    f = tmp_path / "x.pt"
    f.write_bytes(GOOD + b"\xc9" + GOOD + b"\x19\x01")
    r = run(f)
    no_traceback(r)
    assert r.returncode == 0
    assert f"[{len(GOOD):x}: error decoding packet: unknown opcode]" in r.stdout
    assert r.stdout.count("  psb\n") == 2  # both halves decoded
    assert f"offset {2 * len(GOOD) + 1:#x}: truncated packet" in r.stderr
    assert "offset 0x25: unknown opcode" in r.stderr


def test_usage_errors():
    r = run("--bogus", "x")
    assert r.returncode == 2 and "unknown option: --bogus" in r.stderr
    r = run("--time", "--tcal", "x")
    assert r.returncode == 2 and "either --time or --tcal" in r.stderr
    r = run("--mtc-freq", "300", "x")
    assert r.returncode == 2 and "value too big" in r.stderr
    r = run()
    assert r.returncode == 2
    no_traceback(r)


def test_unknown_cpu_is_reported_like_ptdump(tmp_path):
    f = tmp_path / "a.pt"
    f.write_bytes(GOOD)
    r = run("--cpu", "0/0", f)
    assert r.stdout.startswith("[0: failed to determine errata: unknown cpu]\n")


@pytest.mark.parametrize("no_tcal", [False, True])
def test_sideband_tracks_time(tmp_path, no_tcal):
    """With sideband loaded Intel's ptdump tracks time although none is
    shown: a CYC without calibration gets its diagnostics, and a sideband
    record due at a packet goes after them and before the packet's line
    (output of Intel's ptdump, built with XED, on this input)."""
    from hwtrace.perf import records as R

    (tmp_path / "a.pt").write_bytes(
        encode(
            [
                Packet(Kind.PSB),
                Packet(Kind.PSBEND),
                Packet(Kind.CYC, 1),
                Packet(Kind.TSC, 0x1000),
                Packet(Kind.CYC, 2),
                Packet(Kind.TSC, 0x2000),
            ]
        )
    )
    st_ = int(R.SampleType.TID | R.SampleType.TIME)
    (tmp_path / "a.sb").write_bytes(
        b"".join(
            R.pack_record(R.Comm(1, 2, name, exec=True), st_, sample_id=R.SampleId(1, 2, time))
            for name, time in (("sh", 0), ("ls", 0x1800))
        )
    )
    opts = ["--no-tcal"] if no_tcal else []
    r = run(*opts, "--sb", "--pevent:sample-type", st_, "--pevent:primary", "a.sb", "a.pt",
            cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    cal = [] if no_tcal else ["[{}: calibration error: no timing information]"]
    want = [
        "0000000000000000  psb",
        "0000000000000010  psbend",
        *(c.format("12") for c in cal),
        "[12: error updating time: no calibration]",
        "PERF_RECORD_COMM.EXEC  1/2, sh  { 1/2 0 }",
        "0000000000000012  cyc        1",
        "0000000000000013  tsc        1000",
        *(c.format("1b") for c in cal),
        "[1b: error updating time: no calibration]",
        "000000000000001b  cyc        2",
        "PERF_RECORD_COMM.EXEC  1/2, ls  { 1/2 1800 }",
        "000000000000001c  tsc        2000",
    ]
    assert [" ".join(x.split()) for x in r.stdout.splitlines()] == [
        " ".join(x.split()) for x in want
    ]
