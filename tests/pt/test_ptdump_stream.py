"""hwtrace ptdump reads its input in chunks: where the chunks end never shows.

Each case runs the command (in this process) once with the defaults and
once with tiny input chunks, packet tables and output buffers, and the two
outputs must be the same bytes: on Intel's conformance inputs with their
options and others, on libipt-encoded streams, and on hwtrace-encoded
streams of every packet kind with bytes flipped to make decode errors.
"""

from __future__ import annotations

import contextlib
import io
import json
import random

import libipt_oracle as oracle
import numpy as np
import pytest
from conftest import CONFORMANCE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace import aot
from hwtrace.cli.ptdump import main as ptdump_main
from hwtrace.pt import ptdump as P
from hwtrace.pt._loops import FIXED_SIZE, decode_packet
from hwtrace.pt.config import PtConfig
from hwtrace.pt.dumpplain import dump_plain
from hwtrace.pt.kinds import Kind
from hwtrace.pt.packets import Packet, decode, encode
from hwtrace.pt.ptdump import DumpOptions, dump_stream

CASES = CONFORMANCE / "cases"


def _ptdump_cases() -> list[dict]:
    manifest = CONFORMANCE / "manifest.json"
    if not manifest.exists():
        return []
    return [c for c in json.loads(manifest.read_text())["cases"] if "ptdump" in c]


PTDUMP_CASES = _ptdump_cases()

# Options besides each case's own (every ptdump option is in some).
EXTRA = [
    [],
    ["--quiet"],
    ["--quiet", "--lastip"],
    ["--raw", "--lastip", "--exec-mode"],
    ["--no-pad", "--no-timing"],
    ["--no-cyc", "--no-offset", "--raw"],
    ["--json"],
    ["--human"],
    ["--json", "--time", "--mtc-freq", "3", "--cpuid-0x15.eax", "1", "--cpuid-0x15.ebx", "4"],
    ["--tcal", "--time-delta", "--nom-freq", "4"],
    ["--time", "--no-wall-clock", "--no-tcal", "--keep-tcal-on-ovf"],
    ["--no-sync"],
]


def run_cli(argv: list[str]) -> tuple[int, bytes, str]:
    """``hwtrace ptdump ARGV`` in this process: status, output, messages."""
    out = io.TextIOWrapper(io.BytesIO(), write_through=True)
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = ptdump_main(argv)
        out.flush()
    return rc, out.buffer.getvalue(), err.getvalue()


@contextlib.contextmanager
def tiny(chunk: int, rows: int, out: int, errors: int = 1):
    """Every buffer of the dump as small as it goes."""
    saved = (P.CHUNK_SIZE, P.TABLE_ROWS, P.OUT_SIZE, P.ERROR_ROWS)
    P.CHUNK_SIZE, P.TABLE_ROWS, P.OUT_SIZE, P.ERROR_ROWS = chunk, rows, out, errors
    try:
        yield
    finally:
        P.CHUNK_SIZE, P.TABLE_ROWS, P.OUT_SIZE, P.ERROR_ROWS = saved


_whole: dict[tuple, tuple] = {}


def whole(argv: list[str]) -> tuple:
    key = tuple(argv)
    if key not in _whole:
        _whole[key] = run_cli(argv)
    return _whole[key]


def case_argv(case: dict, extra: list[str]) -> list[str]:
    sb = []
    for s in case["sideband"]:
        for k, v in s["options"].items():
            sb += [f"--{s['format']}:{k}", v]
        sb += [f"--{s['format']}:{s['priority']}", s["file"]]
    cpu = ["--cpu", case["cpus"][0]] if case["cpus"] else []
    return cpu + case["ptdump"]["args"] + extra + sb + [case["pt"]]


@pytest.mark.skipif(not PTDUMP_CASES, reason=f"conformance suite not found at {CONFORMANCE}")
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.sampled_from(PTDUMP_CASES or [{}]),
    st.sampled_from(EXTRA),
    st.integers(1, 40),
    st.integers(1, 9),
    st.integers(1, 3000),
)
def test_conformance_inputs_in_tiny_chunks(monkeypatch, case, extra, chunk, rows, out):
    monkeypatch.chdir(CASES)
    argv = case_argv(case, extra)
    with tiny(chunk, rows, out):
        got = run_cli(argv)
    assert got == whole(argv), " ".join(argv)


def _random_stream(seed: int) -> bytes:
    """Packets of every kind hwtrace encodes, PSB+ now and then, some bytes
    flipped (decode errors, resynchronisation)."""
    rng = random.Random(seed)
    kinds = [
        lambda: Packet(Kind.TNT8, rng.getrandbits(3) | 1, 3),
        lambda: Packet(Kind.TNT64, rng.getrandbits(40) | 1, 40),
        lambda: Packet(Kind.TIP, rng.getrandbits(16), 1),
        lambda: Packet(Kind.FUP, rng.getrandbits(47), 3),
        lambda: Packet(Kind.TIP_PGE, rng.getrandbits(64), 6),
        lambda: Packet(Kind.TIP_PGD, 0, 0),
        lambda: Packet(Kind.MODE_EXEC, rng.getrandbits(3)),
        lambda: Packet(Kind.MODE_TSX, rng.getrandbits(2)),
        lambda: Packet(Kind.PIP, rng.getrandbits(40) << 5, rng.getrandbits(1)),
        lambda: Packet(Kind.VMCS, rng.getrandbits(40) << 12),
        lambda: Packet(Kind.TSC, rng.getrandbits(56)),
        lambda: Packet(Kind.MTC, rng.getrandbits(8)),
        lambda: Packet(Kind.TMA, rng.getrandbits(16), rng.getrandbits(9)),
        lambda: Packet(Kind.CYC, rng.getrandbits(rng.choice([4, 12, 40]))),
        lambda: Packet(Kind.CBR, rng.getrandbits(8)),
        lambda: Packet(Kind.PAD),
        lambda: Packet(Kind.OVF),
        lambda: Packet(Kind.MNT, rng.getrandbits(64)),
        lambda: Packet(Kind.PTW, rng.getrandbits(32), 0, rng.getrandbits(1)),
        lambda: Packet(Kind.EXSTOP, 0, 0, rng.getrandbits(1)),
        lambda: Packet(Kind.MWAIT, rng.getrandbits(32), rng.getrandbits(32)),
        lambda: Packet(Kind.PWRE, rng.getrandbits(4), rng.getrandbits(4), rng.getrandbits(1)),
        lambda: Packet(Kind.PWRX, rng.getrandbits(4), rng.getrandbits(4), rng.choice([1, 2, 4])),
        lambda: Packet(Kind.CFE, rng.choice([1, 5, 15]), rng.getrandbits(8), rng.getrandbits(1)),
        lambda: Packet(Kind.EVD, rng.getrandbits(64), rng.getrandbits(2)),
        lambda: Packet(Kind.TRIG, rng.getrandbits(8), 5, 2),
    ]
    packets: list[Packet] = []
    for _ in range(rng.randint(20, 300)):
        r = rng.random()
        if r < 0.05:
            packets += [Packet(Kind.PSB), Packet(Kind.TSC, rng.getrandbits(40))]
            packets += [Packet(Kind.CBR, 3), Packet(Kind.PSBEND)]
        elif r < 0.08:
            packets.append(Packet(Kind.BBP, rng.getrandbits(5), rng.getrandbits(1)))
            sz4 = packets[-1].b
            packets += [
                Packet(Kind.BIP, rng.getrandbits(32 if sz4 else 64), rng.getrandbits(5), sz4)
                for _ in range(rng.randint(0, 3))
            ]
            packets.append(Packet(Kind.BEP, 0, 0, rng.getrandbits(1)))
        else:
            packets.append(rng.choice(kinds)())
    data = bytearray(encode([Packet(Kind.PSB), Packet(Kind.PSBEND), *packets]))
    for _ in range(rng.randint(0, 6)):
        data[rng.randrange(len(data))] = rng.getrandbits(8)
    if rng.random() < 0.3:  # a long run of PSB pattern
        at = rng.randrange(len(data))
        data[at:at] = b"\x02\x82" * rng.randint(8, 40)
    return bytes(data[: rng.randint(len(data) // 2, len(data))])


STREAM_OPTIONS = [
    ("ptdump", DumpOptions()),
    ("ptdump", DumpOptions(quiet=True)),
    ("ptdump", DumpOptions(raw=True, lastip=True, exec_mode=True, time=True, time_delta=True)),
    ("ptdump", DumpOptions(tcal=True, no_pad=True)),
    ("json", DumpOptions(time=True)),
    ("human", DumpOptions()),
]
CONFIG = PtConfig(mtc_freq=3, nom_freq=4, cpuid_0x15_eax=2, cpuid_0x15_ebx=7)


def dump_bytes(data: bytes, style: str, options: DumpOptions, sync: bool = True, **sizes) -> bytes:
    out: list[bytes] = []
    summary = dump_stream(
        io.BytesIO(data),
        lambda b: out.append(bytes(b)),
        options,
        CONFIG,
        sync=sync,
        style=style,
        **sizes,
    )
    return b"".join(out) + repr(summary).encode()


@settings(max_examples=120, deadline=None)
@given(
    st.integers(0, 1 << 30),
    st.sampled_from(STREAM_OPTIONS),
    st.booleans(),
    st.integers(1, 64),
    st.integers(1, 9),
)
def test_encoded_streams_in_tiny_chunks(seed, style_options, sync, chunk, rows):
    data = _random_stream(seed)
    style, options = style_options
    expected = dump_bytes(data, style, options, sync)
    with tiny(chunk, rows, 1100, 1):
        assert dump_bytes(data, style, options, sync) == expected


@pytest.mark.skipif(oracle.skip_reason is not None, reason=oracle.skip_reason or "")
def test_libipt_streams_in_tiny_chunks(tmp_path):
    rng = random.Random(5)
    for seed in range(4):
        path = oracle.generate(tmp_path / f"s{seed}.pt", 6000, seed=seed, mix="all", psb_period=512)
        data = bytearray(path.read_bytes())
        if seed:
            for _ in range(seed * 3):
                data[rng.randrange(len(data))] = rng.getrandbits(8)
        for style, options in STREAM_OPTIONS:
            expected = dump_bytes(bytes(data), style, options)
            for chunk in (1, 7, 100):
                with tiny(chunk, 5, 1100, 1):
                    assert dump_bytes(bytes(data), style, options) == expected, (seed, chunk)


def test_quiet_prints_the_errors_of_the_full_listing():
    """--quiet only checks the stream (no packet rows): the same errors, the
    same packet count."""
    for seed in range(40):
        data = _random_stream(seed)
        full = dump_bytes(data, "ptdump", DumpOptions()).split(b"DumpSummary")
        quiet = dump_bytes(data, "ptdump", DumpOptions(quiet=True)).split(b"DumpSummary")
        errors = [ln for ln in full[0].splitlines() if ln.startswith(b"[")]
        assert quiet[0].splitlines() == errors
        assert quiet[1] == full[1]


def test_fixed_size_table_matches_the_decoder():
    """The first bytes --quiet steps over decode to packets of that size
    whatever follows."""
    rng = np.random.default_rng(3)
    for b0 in np.flatnonzero(FIXED_SIZE):
        for _ in range(8):
            buf = rng.integers(0, 256, 24, dtype=np.uint8)
            buf[0] = b0
            size, kind, *_ = decode_packet(buf, 0, buf.shape[0], 0, 0)
            assert size == FIXED_SIZE[b0] and kind > 0, hex(b0)
    sizes = {int(b) for b in np.flatnonzero(FIXED_SIZE == 0)}
    assert 0x02 in sizes and 0x99 in sizes and 0x03 in sizes  # extended, MODE, CYC


def test_psb_at_the_end_of_a_chunk_is_found_after_an_error():
    """A PSB whose pattern straddles chunk ends, after garbage: the search
    goes on across chunks."""
    good = encode([Packet(Kind.PSB), Packet(Kind.TSC, 5), Packet(Kind.PSBEND)])
    data = good + b"\xc9" + bytes(range(3, 40, 2)) + good + b"\x02\x82" * 30 + good
    expected = dump_bytes(data, "ptdump", DumpOptions())
    assert expected.count(b"psb\n") >= 3 and b"error decoding packet" in expected
    for chunk in range(1, 40):
        with tiny(chunk, 2, 1100, 1):
            assert dump_bytes(data, "ptdump", DumpOptions()) == expected, chunk


def test_ptdump_lines_of_a_whole_table():
    """The table API (used by tests and tools) prints what the stream does."""
    data = _random_stream(11)
    options = DumpOptions(lastip=True, raw=True)
    table = decode(data)
    text = b"".join(P.ptdump_lines(table, np.frombuffer(data, np.uint8), options, CONFIG))
    stream = dump_bytes(data, "ptdump", options).split(b"DumpSummary")[0]
    assert text == stream


def test_pipe_input(tmp_path):
    """A trace can come through a pipe (it is read, not mapped)."""
    import subprocess
    import sys

    data = _random_stream(2)
    f = tmp_path / "t.pt"
    f.write_bytes(data)
    cmd = [sys.executable, "-m", "hwtrace.cli.main", "ptdump"]
    direct = subprocess.run([*cmd, str(f)], capture_output=True)
    piped = subprocess.run([*cmd, "/dev/stdin"], input=data, capture_output=True)
    assert piped.stdout == direct.stdout and piped.returncode == direct.returncode
    ranged = subprocess.run([*cmd, f"{f}:3-200"], capture_output=True)
    piped = subprocess.run([*cmd, "/dev/stdin:3-200"], input=data, capture_output=True)
    assert piped.stdout == ranged.stdout


def _ptdump_library(directory) -> object:
    """A native kernel library in ``directory`` holding ptdump's kernels,
    compiled through numba first (None: no C compiler to link it); the
    library `make` built is copied there first, when up to date, so that
    only what it lacks is built."""
    from conftest import copy_of_built_loops

    aot.use_library(None)
    try:
        for seed in range(3):
            for style, options in STREAM_OPTIONS:
                dump_bytes(_random_stream(seed), style, options, chunk_size=97)
        return aot.build(copy_of_built_loops(directory))
    finally:
        aot.use_library(None)
        aot._library = False


def test_native_and_numba_kernels_agree(ptdump_library):
    """The ahead-of-time library runs the same code as numba: same bytes,
    and ptdump's kernels do not go through numba when it is there."""
    cases = [(seed, style, options) for seed in range(30)
             for style, options in STREAM_OPTIONS]  # fmt: skip
    aot.use_library(None)
    try:
        want = [dump_bytes(_random_stream(seed), style, options, chunk_size=97)
                for seed, style, options in cases]  # fmt: skip
    finally:
        assert aot.use_library(ptdump_library)
    aot._fallbacks.clear()
    got = [dump_bytes(_random_stream(seed), style, options, chunk_size=97)
           for seed, style, options in cases]  # fmt: skip
    assert not {"hwtrace.pt._loops:decode_stream",
                "hwtrace.pt._ptdump_loop:format_loop"} & aot.fallbacks()  # fmt: skip
    assert got == want


def test_without_a_compiler_numba_runs_the_kernels(tmp_path, monkeypatch):
    """No C compiler: no library, and the kernels come from numba."""
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert aot.build(tmp_path) is None
    # (The library in use before, restored after: the tests after this one
    # in the same process run with the module's library, not the one `make`
    # built.)
    before = aot._library
    aot.use_library(None)
    try:
        data = _random_stream(1)
        assert dump_bytes(data, "ptdump", DumpOptions()) == dump_bytes(
            data, "ptdump", DumpOptions(), chunk_size=97
        )
    finally:
        aot._library = before


def _imports_after(argv: list[str], env: dict[str, str]) -> dict[str, bool]:
    """Which heavy packages ``hwtrace ARGV`` imported (run in a fresh
    interpreter)."""
    import subprocess
    import sys

    script = (
        "import sys, json\n"
        "from hwtrace.cli.main import main\n"
        "sys.stdout = open('/dev/null', 'w')\n"
        f"main({argv!r})\n"
        "sys.stderr.write(json.dumps({m: m in sys.modules for m in "
        "('numba', 'numpy', 'llvmlite', 'hwtrace.perf')}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(proc.stderr.strip().splitlines()[-1])


def test_startup_imports(ptdump_library, tmp_path):
    """hwtrace --help imports nothing heavy; hwtrace ptdump, with the native
    library there, imports neither numba nor llvmlite (0.3 s and more), nor
    the perf package without sideband options, nor numpy without the time
    model."""
    import os

    env = {**os.environ, "HWTRACE_CACHE_DIR": str(ptdump_library.parent)}
    env.pop("HWTRACE_AOT", None)
    assert not any(_imports_after(["--help"], env).values())
    trace = tmp_path / "t.pt"
    trace.write_bytes(_random_stream(3))
    seen = _imports_after(["ptdump", str(trace)], env)
    assert seen == {"numba": False, "numpy": False, "llvmlite": False, "hwtrace.perf": False}
    # (the time model is numpy's)
    seen = _imports_after(["ptdump", "--time", str(trace)], env)
    assert seen == {"numba": False, "numpy": True, "llvmlite": False, "hwtrace.perf": False}
    # ... but it does when the library cannot be had.
    seen = _imports_after(["ptdump", str(trace)], {**env, "HWTRACE_AOT": "numba"})
    assert seen["numba"]


@pytest.fixture(scope="module")
def ptdump_library(tmp_path_factory):
    """ptdump's loops in a native library of their own, in use."""
    manifest = _ptdump_library(tmp_path_factory.mktemp("ptdump-lib"))
    if manifest is None:
        pytest.skip("no C compiler to link the library with")
    assert aot.use_library(manifest)
    yield manifest
    aot.use_library(None)
    aot._library = False


def plain_bytes(data: bytes, options: DumpOptions, sync: bool = True, **sizes) -> bytes | None:
    """:func:`dump_plain`'s listing and summary, as :func:`dump_bytes`
    gives :func:`dump_stream`'s (None where it declines)."""
    out: list[bytes] = []
    summary = dump_plain(
        io.BytesIO(data), lambda b: out.append(bytes(b)), options, CONFIG, sync=sync, **sizes
    )
    return None if summary is None else b"".join(out) + repr(summary).encode()


PLAIN_OPTIONS = [
    DumpOptions(),
    DumpOptions(quiet=True),
    DumpOptions(quiet=True, lastip=True),
    DumpOptions(raw=True, lastip=True, exec_mode=True, show_offset=False),
    DumpOptions(no_pad=True, no_timing=True, no_cyc=True),
]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    st.integers(0, 1 << 30),
    st.sampled_from(PLAIN_OPTIONS),
    st.booleans(),
    st.integers(1, 64),
    st.integers(1, 9),
    st.integers(1, 3000),
    st.integers(1, 3),
    st.one_of(st.none(), st.integers(0, 5000)),
)
def test_plain_dump_is_the_stream_dump(ptdump_library, monkeypatch, seed, options, sync, chunk,
                                       rows, out, errors, hint):  # fmt: skip
    """ptdump without numpy writes what the numpy driver writes, whatever
    the sizes of its buffers (decode errors carried from table to table,
    error rows grown) and whatever the input's size is said to be."""
    import hwtrace.pt.dumpplain as D

    data = _random_stream(seed)
    want = dump_bytes(data, "ptdump", options, sync)
    monkeypatch.setattr(D, "ERROR_ROWS", errors)
    got = plain_bytes(data, options, sync, chunk_size=chunk, table_rows=rows, out_size=out,
                      size_hint=hint)  # fmt: skip
    assert got == want
    if hint is not None:
        # (the defaults, cut down to the hint alone)
        assert plain_bytes(data, options, sync, size_hint=hint) == want


@pytest.mark.skipif(oracle.skip_reason is not None, reason=oracle.skip_reason or "")
def test_plain_dump_of_libipt_streams(ptdump_library, tmp_path):
    rng = random.Random(7)
    for seed in range(3):
        path = oracle.generate(tmp_path / f"s{seed}.pt", 6000, seed=seed, mix="all", psb_period=512)
        data = bytearray(path.read_bytes())
        for _ in range(seed * 4):
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        for options in PLAIN_OPTIONS:
            want = dump_bytes(bytes(data), "ptdump", options)
            assert plain_bytes(bytes(data), options) == want
            assert plain_bytes(bytes(data), options, chunk_size=5, table_rows=3) == want


def test_plain_dump_declines_time_and_a_missing_library(ptdump_library):
    data = _random_stream(2)
    assert plain_bytes(data, DumpOptions(time=True)) is None
    aot.use_library(None)
    try:
        assert plain_bytes(data, DumpOptions()) is None
    finally:
        assert aot.use_library(ptdump_library)
