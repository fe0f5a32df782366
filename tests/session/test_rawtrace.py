"""A raw trace opened as a session (``--pt`` with ``--elf``): decoding it
gives the encoded path, and ``funclatency --pt`` finds the calls and
instruction counts that the same trace wrapped as a perf.data gives."""

from __future__ import annotations

import json

import groundtruth as gt
import numpy as np
import pytest

from hwtrace.cli.main import main as hwtrace_main
from hwtrace.image import Image
from hwtrace.pt.decode import decode_trace
from hwtrace.pt.encode import encode_path
from hwtrace.session import SessionError
from hwtrace.session.rawtrace import RawTrace


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    if gt.skip_reason is not None:
        pytest.skip(str(gt.skip_reason))
    run = gt.case("mixed", "-O2")
    image = Image()
    image.add_elf(run.elf, run.load_address)
    enc = encode_path(np.tile(run.ips, 8), image, end_ip=run.end_ip, tsc=1 << 40, mtc_freq=3,
                      ctc_ratio=100, cbr=24, psb_period=512)  # fmt: skip
    path = tmp_path_factory.mktemp("raw") / "trace.pt"
    path.write_bytes(enc.data)
    spec = str(run.elf) if run.load_address is None else f"{run.elf}:{run.load_address:#x}"
    return path, spec, run, enc


def clock(cfg) -> list[str]:
    return ["--mtc-freq", str(cfg.mtc_freq), "--nom-freq", str(cfg.nom_freq),
            "--cpuid-0x15.eax", str(cfg.cpuid_0x15_eax),
            "--cpuid-0x15.ebx", str(cfg.cpuid_0x15_ebx)]  # fmt: skip


def test_open_decode_and_symbols(raw) -> None:
    path, spec, run, enc = raw
    trace = RawTrace.open(path, elf=[spec], config=enc.config)
    got = decode_trace(trace.data, trace.image, trace.config)
    assert got.n_insn == len(enc.expected) and not got.gaps
    assert trace.symbol(run.entry).startswith("mixed")


def test_funclatency_pt_agrees_with_the_wrapped_perf_data(raw, tmp_path) -> None:
    path, spec, _, enc = raw
    wrapped = tmp_path / "w.data"
    RawTrace.open(path, elf=[spec], config=enc.config).as_perf_data(wrapped)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = ["funclatency", "collatz", "--all-intervals", "--json"]
    assert hwtrace_main([*args, str(a), "--pt", str(path), "--elf", spec, *clock(enc.config)]) == 0
    assert hwtrace_main([*args, str(b), "-i", str(wrapped)]) == 0
    mine, theirs = json.loads(a.read_text()), json.loads(b.read_text())
    assert (mine["unit"], theirs["unit"]) == ("TSC ticks", "ns")
    assert mine["instructions"] == theirs["instructions"] == len(enc.expected)
    calls = [iv["dic"] for iv in mine["intervals"]]
    assert len(calls) == 8 * 3  # a collatz call per iteration of mixed(4, 3), 8 times over
    assert calls == [iv["dic"] for iv in theirs["intervals"]]


def test_bad_binary_is_one_line(raw, tmp_path, capsys) -> None:
    path, _, _, _ = raw
    with pytest.raises(SessionError, match="nope"):
        RawTrace.open(path, elf=[str(tmp_path / "nope")])
    capsys.readouterr()
    assert (
        hwtrace_main(["funclatency", "f", "--pt", str(path), "--elf", str(tmp_path / "nope")]) == 1
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err and "Traceback" not in err
