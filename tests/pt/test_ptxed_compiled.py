"""``hwtrace ptxed``'s compiled decoder and formatter against the reference.

The reference is Intel's decoders as plain Python (:mod:`oracles.events`,
:mod:`oracles.flow`) printed line by line in Python; Intel's conformance
suite holds that one to Intel's ptxed.  Here the compiled path must print
exactly the same bytes, under every output option, on

* every conformance trace (core and perf_event sideband suites),
* traces of real compiled programs (the ground-truth corpus: gcc-built
  functions run under unicorn, encoded with randomized settings, including
  interrupts and tracing switched off and on), and
* mutated conformance traces (the fuzz corpus: errors, resynchronisation,
  garbage between packets),

and again when the compiled decoder reads its packets a PSB period at a
time, as it streams large traces.
"""

from __future__ import annotations

import importlib.util
import io
import json
import random
import shutil

import groundtruth as gt
import numpy as np
import pytest
from conftest import CONFORMANCE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles.ptxed import decode_reference

from hwtrace.cli import ptxed
from hwtrace.pt import flowdec
from hwtrace.pt.flowdec import FlowDecoder

OPTION_SETS = [
    [],
    ["--time", "--offset"],
    ["--event:time", "--event:ip"],
    ["--block:show-blocks", "--stat"],
    ["--resync-on-error", "--event:ip"],
    ["--insn-decoder", "--stat"],
    ["--block:end-on-call", "--block:show-blocks"],
    ["--block:end-on-jump", "--event:tick", "--time"],
    ["--event:iflags", "--event:ip"],
    ["--quiet", "--stat"],
    ["INST"],
    ["INST", "--att", "--raw-insn", "--offset"],
    ["INST", "--block:show-blocks", "--stat", "--time"],
]


def _runner():
    path = CONFORMANCE / "run.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("conformance_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RUN = _runner()
MANIFEST = (
    json.loads((CONFORMANCE / "manifest.json").read_text())["cases"] if RUN is not None else []
)
PTXED_CASES = [c for c in MANIFEST if "ptxed" in c]
LARGE_BIN = 16 << 10


def ptxed_output(argv: list[str], reference: bool) -> bytes:
    buf = io.BytesIO()
    assert ptxed.main(argv, buf, decoder=decode_reference if reference else None) == 0
    return buf.getvalue()


def with_options(argv: list[str], extra: list[str]) -> list[str]:
    if "INST" in extra:
        argv = [a for a in argv if a != "--no-inst"]
        extra = [e for e in extra if e != "INST"]
    i = argv.index("--pt")
    return argv[:i] + extra + argv[i:]


def assert_same(argv: list[str], tiny_windows: bool = False) -> None:
    """Compiled and reference output are the same bytes; with
    ``tiny_windows`` the compiled decoder also reads its packets one PSB
    period at a time (every window edge carried over exactly)."""
    want = ptxed_output(argv, reference=True)
    got = ptxed_output(argv, reference=False)
    if got == want and tiny_windows:
        saved = FlowDecoder.window_bytes
        FlowDecoder.window_bytes = 1
        try:
            got = ptxed_output(argv, reference=False)
            if got == want and "--time" in argv:
                got, want = _opened_both_ways(argv), want + want
        finally:
            FlowDecoder.window_bytes = saved
    if got != want:
        a, b = want.decode().splitlines(), got.decode().splitlines()
        at = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        raise AssertionError(
            f"{' '.join(argv)}: line {at}: reference {a[at : at + 3]} compiled {b[at : at + 3]}"
        )


def _opened_both_ways(argv: list[str]) -> bytes:
    """The compiled decoder's output with its windows opened in one
    compiled call and the long way in turn: each starts from the time
    model's state the other left at its limit; and with every window
    opened by the flow loop itself, as it does for a trace in memory (a
    file's it opens 16 at a time, Python letting their pages go between)."""
    compiled = FlowDecoder._open_compiled
    turn = iter(range(1 << 30))

    def alternate(self, *args):
        return compiled(self, *args) if next(turn) % 2 else None

    FlowDecoder._open_compiled = alternate
    try:
        got = ptxed_output(argv, reference=False)
    finally:
        FlowDecoder._open_compiled = compiled
    mapped = flowdec.is_mapped
    flowdec.is_mapped = lambda buf: False
    try:
        return got + ptxed_output(argv, reference=False)
    finally:
        flowdec.is_mapped = mapped


@pytest.mark.skipif(RUN is None, reason=f"conformance suite not found at {CONFORMANCE}")
@pytest.mark.parametrize("case", PTXED_CASES, ids=[c["name"] for c in PTXED_CASES])
def test_conformance_inputs(case, tmp_path, monkeypatch):
    for f in [case["pt"], case["bin"]] + [s["file"] for s in case["sideband"]]:
        shutil.copy(CONFORMANCE / "cases" / f, tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = next(iter(RUN.command_lines(case, "ptxed", ["ptxed"])))[1:]
    # The long straight-line cases (100,000 instructions, where the
    # reference decoder takes seconds an option set) are about the flow,
    # not the options, which every other case covers: three sets there.
    large = (CONFORMANCE / "cases" / case["bin"]).stat().st_size > LARGE_BIN
    for extra in OPTION_SETS[::6] if large else OPTION_SETS:
        assert_same(with_options(argv, extra), tiny_windows=True)


# -- the fuzz corpus -----------------------------------------------------------

CORE = [c for c in PTXED_CASES if c["suite"] == "core"]


@pytest.mark.skipif(not CORE, reason=f"conformance suite not found at {CONFORMANCE}")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(CORE or [None]),
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=6),
    options=st.sampled_from(OPTION_SETS),
)
def test_mutated_traces(tmp_path_factory, case, flips, options):
    tmp = tmp_path_factory.mktemp("fuzz")
    data = bytearray((CONFORMANCE / "cases" / case["pt"]).read_bytes())
    for pos, value in flips:
        if data:
            data[pos % len(data)] = value
    (tmp / "t.pt").write_bytes(bytes(data))
    shutil.copy(CONFORMANCE / "cases" / case["bin"], tmp / "t.bin")
    argv = ["--raw", f"{tmp / 't.bin'}:{case['org']}", "--no-inst", "--pt", str(tmp / "t.pt")]
    assert_same(with_options(argv, options), tiny_windows=True)


# -- the ground-truth corpus ---------------------------------------------------


@pytest.mark.skipif(gt.skip_reason is not None, reason=str(gt.skip_reason))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(gt.CASES)),
    opt=st.sampled_from(gt.OPT_LEVELS),
    seed=st.integers(0, 2**32 - 1),
    options=st.sampled_from(OPTION_SETS),
    settings_=st.fixed_dictionaries(
        {
            "ret_compression": st.booleans(),
            "long_tnt": st.booleans(),
            "defer_tips": st.booleans(),
            "psb_period": st.sampled_from([0, 28, 72, 200, 1000]),
        }
    ),
)
def test_real_programs(tmp_path_factory, name, opt, seed, options, settings_):
    from hwtrace.image import Image
    from hwtrace.pt.encode import encode_path

    run = gt.case(name, opt)
    image = Image()
    image.add_elf(run.elf, run.load_address)
    rnd = random.Random(seed)
    ips = run.ips
    # One interrupt and one stretch with tracing off, as in a real recording.
    k = rnd.randint(1, len(ips) - 2)
    j = rnd.randint(0, len(ips) - 2)
    ips = np.concatenate([ips[:k], ips[j:]])
    p = rnd.randint(k + 2, len(ips) - 1) if k + 2 < len(ips) - 1 else None
    trace_off = [(p, min(len(ips), p + rnd.randint(1, 300)))] if p is not None else []
    enc = encode_path(
        ips,
        image,
        end_ip=run.end_ip,
        interrupts=[(k, int(run.ips[k]))],
        trace_off=trace_off,
        tsc=rnd.randint(0, 1 << 40),
        mtc_freq=3,
        cyc=rnd.random() < 0.5,
        cycles=np.array([rnd.randint(1, 9) for _ in range(len(ips))]),
        **settings_,
    )
    tmp = tmp_path_factory.mktemp("gt")
    pt = tmp / "t.pt"
    pt.write_bytes(enc.data)
    elf = str(run.elf) if run.load_address is None else f"{run.elf}:{run.load_address:#x}"
    cfg = enc.config
    argv = ["--elf", elf, "--no-inst"]
    argv += ["--mtc-freq", str(cfg.mtc_freq), "--nom-freq", str(cfg.nom_freq)]
    argv += [
        "--cpuid-0x15.eax",
        str(cfg.cpuid_0x15_eax),
        "--cpuid-0x15.ebx",
        str(cfg.cpuid_0x15_ebx),
    ]
    argv += ["--pt", str(pt)]
    assert_same(with_options(argv, options), tiny_windows=True)


def test_compiled_output_is_ptxed_text_on_a_real_program(tmp_path):
    """Not only equal to the reference: the right instructions, in order."""
    if gt.skip_reason is not None:
        pytest.skip(str(gt.skip_reason))
    from hwtrace.image import Image
    from hwtrace.pt.encode import encode_path

    run = gt.case(sorted(gt.CASES)[0], gt.OPT_LEVELS[0])
    image = Image()
    image.add_elf(run.elf, run.load_address)
    enc = encode_path(run.ips, image, end_ip=run.end_ip)
    (tmp_path / "t.pt").write_bytes(enc.data)
    elf = str(run.elf) if run.load_address is None else f"{run.elf}:{run.load_address:#x}"
    out = ptxed_output(["--elf", elf, "--no-inst", "--pt", str(tmp_path / "t.pt")], False)
    lines = [x for x in out.decode().splitlines() if not x.startswith("[")]
    assert [int(x, 16) for x in lines] == [int(x) for x in enc.expected]


def test_line_table_grown_piece_by_piece_is_the_whole_table(tmp_path):
    """The formatter's line table, brought up to date after every fill of a
    growing code table (past its first 4,096 instructions, where its arrays
    are reallocated), is the one built at once from the whole table."""
    from hwtrace.image import Image
    from hwtrace.pt.codetable import FILL_MAX, CodeTable
    from hwtrace.pt.ptxed import LineTable, PtxedStyle

    # Straight-line code, learnt a fill (256 instructions) at a time from
    # the end backwards: the table's order is not the code's, so its runs
    # of consecutive instructions are many.
    size, count = 3, 9000
    (tmp_path / "code.bin").write_bytes(b"\x83\xc0\x01" * count)
    image = Image()
    image.add_raw(tmp_path / "code.bin", address=0x10000)
    for style in (PtxedStyle(), PtxedStyle(no_inst=True)):
        table = CodeTable(image)
        piecewise = LineTable(style.bits, False)
        for first in range((count - 1) // FILL_MAX * FILL_MAX, -1, -FILL_MAX):
            table.fill(0x10000 + size * first, 64)
            piecewise.update(table)
        whole = LineTable(style.bits, False)
        whole.update(table)
        n = table.n_insns
        assert n == count + 1  # and the address after the code, unmapped
        assert piecewise.contig[:n].max() == FILL_MAX  # a piece, and no more
        np.testing.assert_array_equal(piecewise.contig[:n], whole.contig[:n])
        np.testing.assert_array_equal(piecewise.line_off[: n + 1], whole.line_off[: n + 1])
        end = int(whole.line_off[n])
        assert bytes(piecewise.lines[:end]) == bytes(whole.lines[:end])


def test_interrupted_ptxed_stops_its_thread_quietly(tmp_path, monkeypatch, capsys):
    """^C while ptxed decodes: no traceback, status 130 as after SIGINT, and
    the formatting thread is gone."""
    import threading

    from hwtrace.cli.main import main
    from hwtrace.pt.kinds import Kind
    from hwtrace.pt.packets import Packet, encode

    trace = encode([Packet(Kind.PSB), Packet(Kind.FUP, 0x401000, 3), Packet(Kind.PSBEND)])
    (tmp_path / "a.pt").write_bytes(trace)
    (tmp_path / "code.bin").write_bytes(b"\x90" * 64)
    real = FlowDecoder.decode

    def interrupted(self, data, sink, *args, **kwargs):
        sink.output()  # the writer has its thread by now
        real(self, data, sink, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(FlowDecoder, "decode", interrupted)
    argv = ["ptxed", "--pt", str(tmp_path / "a.pt"), "--raw", f"{tmp_path / 'code.bin'}:0x401000"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted" in err
    assert not [t for t in threading.enumerate() if t.name.startswith("ptxed-format")]


@pytest.mark.parametrize("style", [{"no_inst": True}, {}, {"no_inst": True, "offset": True}])
def test_output_the_same_whatever_the_buffer_size(tmp_path, style):
    """The formatter stops wherever its output buffer is full (in the middle
    of a block, of a stretch of straight code, between events) and goes on
    from there: the text does not depend on the buffer's size or on a second
    thread formatting."""
    if gt.skip_reason is not None:
        pytest.skip(str(gt.skip_reason))
    from hwtrace.image import Image
    from hwtrace.pt.config import PtConfig
    from hwtrace.pt.encode import encode_path
    from hwtrace.pt.flowdec import FlowOptions
    from hwtrace.pt.ptxed import PtxedStyle, PtxedWriter

    run = gt.case(sorted(gt.CASES)[0], gt.OPT_LEVELS[0])
    image = Image()
    image.add_elf(run.elf, run.load_address)
    n = len(run.ips)
    enc = encode_path(run.ips, image, end_ip=run.end_ip, trace_off=[(n // 3, n // 3 + 20)],
                      interrupts=[(n // 2, int(run.ips[n // 2]))], tsc=1 << 30, mtc_freq=3)  # fmt: skip
    outputs = []
    for size, pipelined in ((1 << 20, False), (1, False), (37, True), (300, True)):
        text = io.BytesIO()
        writer = PtxedWriter(PtxedStyle(**style), text.write, buffer_size=size,
                             pipelined=pipelined)  # fmt: skip
        FlowDecoder(image, enc.config or PtConfig(), FlowOptions()).decode(enc.data, writer)
        writer.finish()
        outputs.append(text.getvalue())
    assert outputs[0].count(b"\n") > n - 20
    assert all(out == outputs[0] for out in outputs[1:])
