"""Ground truth for instruction-flow decoding: emulated paths, encoded, decoded back.

Small C programs run in unicorn (:mod:`groundtruth`), which records every
executed instruction.  :func:`hwtrace.pt.encode.encode_path` writes the Intel
PT a processor would have produced for that path, under randomized settings
(return compression, TNT-64, IP compression, deferred TIPs, PSB period,
timing packets, interrupts spliced into the path, tracing switched off and
on).  hwtrace's decoder, libipt's instruction decoder and libipt's block
decoder must each give exactly the traced instructions back, with no errors,
from the start of the stream and from any later PSB.
"""

from __future__ import annotations

import functools
import random
from dataclasses import replace
from pathlib import Path

import groundtruth as gt
import libipt_oracle as oracle
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.image import Image
from hwtrace.pt.encode import STAT_NAMES, EncodedTrace, encode_path
from hwtrace.pt.kinds import Kind
from hwtrace.pt.packets import encode_table

try:
    from hwtrace.pt.decode import decode_trace
except ImportError:  # pragma: no cover - the library decoder is optional here
    decode_trace = None

pytestmark = pytest.mark.skipif(gt.skip_reason is not None, reason=str(gt.skip_reason))

NO_HWTRACE = "hwtrace.pt.decode is not available"
CASES = [(name, opt) for name in gt.CASES for opt in gt.OPT_LEVELS]


@pytest.fixture(scope="module")
def images() -> dict[tuple[Path, int | None], Image]:
    return {}


def image_of(images: dict[tuple[Path, int | None], Image], run: gt.Run) -> Image:
    key = (run.elf, run.load_address)
    if key not in images:
        images[key] = Image()
        images[key].add_elf(run.elf, run.load_address)
    return images[key]


def first_difference(got: np.ndarray, want: np.ndarray) -> str:
    n = min(len(got), len(want))
    diff = np.flatnonzero(got[:n] != want[:n])
    at = int(diff[0]) if diff.shape[0] else n

    def show(a: np.ndarray) -> list[str]:
        return [hex(int(x)) for x in a[max(at - 2, 0) : at + 3]]

    return f"{len(got)} vs {len(want)} insns, first difference at {at}: {show(got)} vs {show(want)}"


def hwtrace_flow(data: bytes, image: Image, enc: EncodedTrace, **kw) -> np.ndarray:
    # Small traces: every thread asked for is used (job_bytes=0).
    res = decode_trace(data, image, enc.config, job_bytes=0, **kw)
    assert not res.gaps, [str(g) for g in res.gaps]
    return res.instructions()


def libipt_flow(
    tmp: Path, data: bytes, run: gt.Run, image: Image, enc: EncodedTrace, block: bool
) -> tuple[np.ndarray, list]:
    path = tmp / ("b.pt" if block else "i.pt")
    path.write_bytes(data)
    timing = {
        "mtc_freq": enc.config.mtc_freq,
        "nom_freq": enc.config.nom_freq,
        "cpuid_0x15_eax": enc.config.cpuid_0x15_eax,
        "cpuid_0x15_ebx": enc.config.cpuid_0x15_ebx,
    }
    elf = run.elf if run.load_address is None else (run.elf, run.load_address)
    flow, errors = oracle.insn_dump(path, elf=[elf], timing=timing, block=block)
    if block:
        return gt.expand_pt_blocks(flow, image.read), errors  # type: ignore[arg-type]
    return np.array(flow, np.uint64), errors


def check_all(
    tmp: Path,
    enc: EncodedTrace,
    run: gt.Run,
    image: Image,
    *,
    start: int = 0,
    jobs: int = 1,
    chunk_bytes: int = 1 << 20,
) -> int:
    """Decode from the PSB at ``start`` with every available decoder and
    require the expected instructions; returns how many decoders ran."""
    data = enc.data[start:]
    want = enc.expected_from(start)
    ran = 0
    if decode_trace is not None:
        got = hwtrace_flow(data, image, enc, jobs=jobs, chunk_bytes=chunk_bytes)
        assert np.array_equal(got, want), "hwtrace: " + first_difference(got, want)
        ran += 1
    if oracle.skip_reason is None:
        for block in (False, True):
            got, errors = libipt_flow(tmp, data, run, image, enc, block)
            name = "libipt block decoder" if block else "libipt insn decoder"
            assert not errors, f"{name}: {errors}"
            assert np.array_equal(got, want), f"{name}: " + first_difference(got, want)
            ran += 1
    return ran


# -- the ground truth itself -------------------------------------------------


@pytest.mark.parametrize("name", list(gt.CASES))
def test_emulated_paths_are_consistent(name):
    """Hooking every instruction and expanding basic blocks record the same
    path, and both optimization levels compute the same result."""
    results = set()
    for opt in gt.OPT_LEVELS:
        by_insn = gt.run(name, gt.CASES[name], opt)
        by_block = gt.case(name, opt)
        assert np.array_equal(by_insn.ips, by_block.ips)
        assert by_insn.result == by_block.result
        assert by_insn.ips[0] == by_insn.entry
        results.add(by_insn.result)
    assert len(results) == 1


def test_programs_exercise_hard_flow(images):
    """The programs contain what they are meant to test."""
    stats: dict[str, int] = dict.fromkeys(STAT_NAMES, 0)
    for name, opt in CASES:
        run = gt.case(name, opt)
        enc = encode_path(run.ips, image_of(images, run), end_ip=run.end_ip, psb_period=0)
        for key, value in enc.stats.items():
            stats[key] += value
    assert stats["call_overflow"] > 0  # recursion deeper than the return stack
    assert stats["ret_compressed"] > 0
    assert stats["ret_uncompressed"] > 0  # longjmp, push+ret, overflowed returns
    assert stats["tip"] > stats["ret_uncompressed"]  # indirect calls and jumps


# -- hand-checked packets ------------------------------------------------------

# 0x1000: xor eax,eax; 0x1002: inc eax; cmp eax,3; jne 0x1002; call 0x1010;
# 0x100e: jmp rbx (to 0x1020); 0x1010: ret; 0x1020: ret (to END)
SNIPPET = bytes.fromhex("31c0 ffc0 83f803 75f9 e802000000 ffe3 c3") + bytes(15) + b"\xc3"
SNIPPET_PATH = [0x1000] + [0x1002, 0x1004, 0x1007] * 3 + [0x1009, 0x1010, 0x100E, 0x1020]
END = 0x5000


def snippet_read(address: int, size: int) -> bytes:
    if 0x1000 <= address < 0x1000 + len(SNIPPET):
        return SNIPPET[address - 0x1000 : address - 0x1000 + size]
    return b""


def packets(enc: EncodedTrace) -> list[tuple[str, int, int]]:
    return [
        (Kind(int(k)).name, int(a), int(b)) for k, a, b in zip(enc.kind, enc.a, enc.b, strict=True)
    ]


def test_snippet_packets():
    ips = np.array(SNIPPET_PATH, np.uint64)
    enc = encode_path(ips, snippet_read, end_ip=END)
    head = [("PSB", 0, 0), ("MODE_EXEC", 1, 0), ("PSBEND", 0, 0), ("MODE_EXEC", 1, 0)]
    # jne taken, taken, not taken; the RET to the CALL's next IP is a taken
    # bit; the TNT goes out before jmp rbx's TIP; the last RET disables.
    assert packets(enc) == [
        *head,
        ("TIP_PGE", 0x1000, 3),
        ("TNT8", 0b1101, 4),
        ("TIP", 0x1020, 1),
        ("TIP_PGD", END, 1),
    ]
    enc = encode_path(ips, snippet_read, end_ip=END, ret_compression=False, sync_disable=False)
    assert packets(enc) == [
        *head,
        ("TIP_PGE", 0x1000, 3),
        ("TNT8", 0b110, 3),
        ("TIP", 0x100E, 1),
        ("TIP", 0x1020, 1),
        ("TIP", END, 1),  # the last RET is traced, then tracing stops before END
        ("FUP", END, 1),
        ("TIP_PGD", 0, 0),
    ]
    assert np.array_equal(enc.expected, ips)


def test_snippet_interrupt_and_psb():
    # An interrupt before 0x1009 runs the handler at 0x1010 (a RET back to
    # 0x1009, which it does not match: uncompressed); PSB+ after every packet.
    ips = np.array([*SNIPPET_PATH[:10], 0x1010, *SNIPPET_PATH[10:]], np.uint64)
    enc = encode_path(ips, snippet_read, end_ip=END, interrupts=[(10, 0x1009)], psb_period=1)
    rows = packets(enc)
    at = rows.index(("FUP", 0x1009, 1))  # the interrupt: FUP(source) + TIP(handler)
    assert rows[at + 1] == ("TIP", 0x1010, 1)
    assert enc.stats["interrupt"] == 1
    # PSB+ comes after every instruction: the call stack empties each time, so
    # both RETs are uncompressed; the last one disables tracing.
    assert enc.stats["psb"] == len(ips) and enc.stats["ret_uncompressed"] == 2
    # Each PSB+ after the first has a full FUP of the instruction to run next,
    # where a decoder starting there begins.
    for off in enc.psb_offsets()[1:]:
        row = int(np.flatnonzero(enc.offset == off)[0])
        end = rows.index(("PSBEND", 0, 0), row)
        fups = [r for r in rows[row:end] if r[0] == "FUP"]
        next_ip = int(enc.expected_from(int(off))[0])
        assert fups == [("FUP", next_ip, 3)]


@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
def test_snippet_decodes(tmp_path):
    (tmp_path / "code.bin").write_bytes(SNIPPET)
    image = Image()
    image.add_raw(tmp_path / "code.bin", 0, None, 0x1000)
    ips = np.array(SNIPPET_PATH, np.uint64)
    for kw in ({}, {"ret_compression": False}, {"defer_tips": True, "psb_period": 8}):
        enc = encode_path(ips, snippet_read, end_ip=END, **kw)
        assert np.array_equal(hwtrace_flow(enc.data, image, enc), ips)


def test_encoder_rejects_impossible_paths():
    ips = np.array(SNIPPET_PATH, np.uint64)
    with pytest.raises(ValueError, match="position 1"):
        encode_path(np.delete(ips, 2), snippet_read, end_ip=END)  # skips an instruction
    with pytest.raises(ValueError, match="position 3"):
        bad = ips.copy()
        bad[4] = 0x1004  # jne goes neither to its target nor falls through
        encode_path(bad, snippet_read, end_ip=END)
    with pytest.raises(ValueError, match="no valid instruction"):
        encode_path(np.array([0x9000], np.uint64), snippet_read, end_ip=END)
    with pytest.raises(ValueError, match="end_ip"):
        encode_path(ips, snippet_read)  # ends on a RET: where to is unknown
    with pytest.raises(ValueError, match="interrupt"):
        encode_path(ips, snippet_read, end_ip=END, interrupts=[(5, 0x1004)], trace_off=[(4, 6)])
    with pytest.raises(ValueError, match="trace_off"):
        encode_path(ips, snippet_read, end_ip=END, trace_off=[(2, 5), (4, 8)])


# -- decoders against the ground truth -------------------------------------------


@pytest.mark.skipif(
    decode_trace is None and oracle.skip_reason is not None,
    reason=f"{NO_HWTRACE}; {oracle.skip_reason}",
)
@pytest.mark.parametrize("ret_compression", [True, False])
@pytest.mark.parametrize("name,opt", CASES)
def test_round_trip(tmp_path, images, name, opt, ret_compression):
    run = gt.case(name, opt)
    image = image_of(images, run)
    enc = encode_path(
        run.ips, image, end_ip=run.end_ip, ret_compression=ret_compression, psb_period=256
    )
    assert np.array_equal(enc.expected, run.ips)
    assert check_all(tmp_path, enc, run, image) > 0


@pytest.mark.skipif(oracle.skip_reason is not None, reason=str(oracle.skip_reason))
@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
def test_a_wrong_trace_is_noticed(tmp_path, images):
    """The comparison can fail: one flipped TNT bit changes what every
    decoder reconstructs (or makes it fail)."""
    run = gt.case("sort", "-O2")
    image = image_of(images, run)
    enc = encode_path(run.ips, image, end_ip=run.end_ip)
    row = int(np.flatnonzero(enc.kind == Kind.TNT8)[3])
    a = enc.a.copy()
    a[row] ^= 1  # the newest bit of the fourth TNT
    bad = encode_table(enc.kind, a, enc.b, np.zeros_like(enc.kind))
    assert len(bad) == len(enc.data) and bad != enc.data
    with pytest.raises(AssertionError):
        check_all(tmp_path, replace(enc, data=bad), run, image)
    res = decode_trace(bad, image, enc.config)
    assert res.gaps or not np.array_equal(res.instructions(), enc.expected)
    for block in (False, True):
        got, errors = libipt_flow(tmp_path, bad, run, image, enc, block)
        assert errors or not np.array_equal(got, enc.expected)


@st.composite
def scenarios(draw):
    """A program path with interrupts spliced in and tracing switched off in
    places, plus encoder settings."""
    name = draw(st.sampled_from(sorted(gt.CASES)))
    opt = draw(st.sampled_from(gt.OPT_LEVELS))
    run = gt.case(name, opt)
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    ips = run.ips
    interrupts: list[tuple[int, int]] = []
    for _ in range(draw(st.integers(0, 3))):
        # Interrupt before ips[k]: the "handler" is the path from ips[j] on.
        k, j = rnd.randint(1, len(ips) - 2), rnd.randint(0, len(ips) - 2)
        # Where ips[k - 1] really goes: an earlier interrupt taken at k
        # already diverted it, from its own source.
        source = next((s for p, s in interrupts if p == k), int(ips[k]))
        moved = [(p - j + k, s) for p, s in interrupts if p > j]
        interrupts = [(p, s) for p, s in interrupts if p < k] + moved + [(k, source)]
        ips = np.concatenate([ips[:k], ips[j:]])
    n = len(ips)
    taken = {p for p, _ in interrupts}
    trace_off: list[tuple[int, int]] = []
    for _ in range(draw(st.integers(0, 3))):
        p = rnd.randint(0, n - 1)
        q = rnd.randint(p + 1, min(n, p + 400))
        clear = all(q + 1 < a or b + 1 < p for a, b in trace_off)
        if clear and not any(p - 1 <= x <= q for x in taken):
            trace_off.append((p, q))
    options = {
        "ret_compression": draw(st.booleans()),
        "long_tnt": draw(st.booleans()),
        "ip_compression": draw(st.booleans()),
        "defer_tips": draw(st.booleans()),
        "sync_disable": draw(st.booleans()),
        "psb_period": draw(st.sampled_from([0, 1, 28, 48, 72, 200, 1000])),
        "interrupts": interrupts,
        "trace_off": trace_off,
    }
    if draw(st.booleans()):
        options["tsc"] = draw(st.integers(0, 1 << 50))
        options["mtc_freq"] = draw(st.sampled_from([None, 0, 2, 5]))
        options["cyc"] = draw(st.booleans())
        options["ctc_ratio"] = draw(st.sampled_from([1, 3, 25]))
        options["cycles"] = np.array([rnd.randint(1, 9) for _ in range(n)])
    decoding = {
        "jobs": draw(st.sampled_from([1, 2])),
        "chunk_bytes": draw(st.sampled_from([64, 1 << 20])),
    }
    return run, ips, options, decoding, rnd.random()


@pytest.mark.skipif(
    decode_trace is None and oracle.skip_reason is not None,
    reason=f"{NO_HWTRACE}; {oracle.skip_reason}",
)
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scenario=scenarios())
def test_randomized_round_trip(tmp_path, images, scenario):
    run, ips, options, decoding, pick = scenario
    image = image_of(images, run)
    enc = encode_path(ips, image, end_ip=run.end_ip, **options)
    traced = np.ones(len(ips), np.bool_)
    for p, q in options["trace_off"]:
        traced[p:q] = False
    assert np.array_equal(enc.expected, ips[traced])
    assert enc.stats["interrupt"] == len(options["interrupts"])
    assert check_all(tmp_path, enc, run, image, **decoding) > 0
    # A decoder may start at any PSB.
    later = enc.psb_offsets()[1:]
    if later.shape[0]:
        start = int(later[int(pick * later.shape[0])])
        check_all(tmp_path, enc, run, image, start=start)


@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
def test_long_run_in_parallel_chunks(images):
    """A longer mixed path, decoded in many chunks on two threads."""
    run = gt.run("mixed", (9, 400), "-O2", blocks=True)
    assert run.result == gt.run("mixed", (9, 400), "-O0", blocks=True).result
    image = image_of(images, run)
    enc = encode_path(run.ips, image, end_ip=run.end_ip, psb_period=512, tsc=1, mtc_freq=3)
    assert enc.stats["psb"] > 100
    got = hwtrace_flow(enc.data, image, enc, jobs=2, chunk_bytes=4096)
    assert np.array_equal(got, run.ips), first_difference(got, run.ips)


@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
def test_frequent_psb_inside_a_chunk(images):
    """A PSB+ after every TNT or so, all inside one decode chunk: the compiled
    walk must not take a PSB+ while a TNT's bits are still pending."""
    run = gt.case("collatz", "-O2")
    image = image_of(images, run)
    wrong = []
    for timing in ({}, {"tsc": 0}):
        for period in range(16, 120):
            enc = encode_path(run.ips, image, end_ip=run.end_ip, psb_period=period, **timing)
            res = decode_trace(enc.data, image, enc.config)
            if res.gaps or not np.array_equal(res.instructions(), enc.expected):
                wrong.append((period, timing))
    assert not wrong, f"wrong flow for (psb_period, timing) in {wrong}"


@pytest.mark.skipif(oracle.skip_reason is not None, reason=str(oracle.skip_reason))
def test_frequent_psb_libipt(tmp_path, images):
    """The streams of the test above are right: libipt decodes them exactly."""
    run = gt.case("collatz", "-O2")
    image = image_of(images, run)
    for period, timing in ((28, {}), (30, {"ip_compression": False}), (40, {"tsc": 0})):
        enc = encode_path(run.ips, image, end_ip=run.end_ip, psb_period=period, **timing)
        for block in (False, True):
            got, errors = libipt_flow(tmp_path, enc.data, run, image, enc, block)
            assert not errors and np.array_equal(got, enc.expected), first_difference(
                got, enc.expected
            )


def _system_calls(n: int, every: int, length: int) -> list[tuple[int, int]]:
    """Tracing off for ``length`` instructions every ``every`` or so (as the
    kernel's work is not traced), over a path of ``n``."""
    rng = np.random.default_rng(5)
    spans, p = [], int(rng.integers(every // 2, every))
    while p + length + 2 < n - 1:
        spans.append((p, p + length))
        p += length + int(rng.integers(every // 2, 3 * every // 2))
    return spans


# Encodings the replay cache meets: branches with MTC between them; a
# system call every few hundred instructions, PSB+ every KiB and cycle
# counts (CYC); uncompressed returns and long TNT packets.
REPLAY_SHAPES = {
    "plain": lambda n: {"psb_period": 4096, "tsc": 1, "mtc_freq": 3},
    "events": lambda n: {
        "psb_period": 1024,
        "tsc": 1,
        "mtc_freq": 3,
        "cyc": True,
        "trace_off": _system_calls(n, 400, 30),
    },
    "noret": lambda n: {
        "psb_period": 2048,
        "tsc": 1,
        "mtc_freq": 3,
        "ret_compression": False,
        "long_tnt": True,
        "trace_off": _system_calls(n, 900, 40),
    },
}


# Longer paths of two cases: stretches met thousands of times, many system
# calls.
LONG_CASES = {"interp-long": ("interp", (11, 3000)), "mixed-long": ("mixed", (4, 200))}


@functools.cache
def _long_case(name: str) -> gt.Run:
    function, args = LONG_CASES[name]
    return gt.run(function, args, "-O2", blocks=True)


def _noting(monkeypatch, of) -> list:
    """A list that gets, for each decode_trace call from now on, ``of`` its
    code tables (a list of them) at its end."""
    from hwtrace.pt import decode as decode_module

    noted: list = []
    result_of = decode_module._result

    def noting(collectors, decoders):
        noted.append(of([t for d in decoders for t in d.tables]))
        return result_of(collectors, decoders)

    monkeypatch.setattr(decode_module, "_result", noting)
    return noted


def _noting_code_tables(monkeypatch, count: str) -> list[int]:
    """A list that gets, for each decode_trace call from now on, the sum of
    its code tables' ``count`` (a CodeTable property) at its end."""
    return _noting(monkeypatch, lambda tables: sum(getattr(t, count) for t in tables))


@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
@pytest.mark.parametrize("shape", sorted(REPLAY_SHAPES))
@pytest.mark.parametrize(
    "name", ["deep", "unwind", "interp", "mixed", "tails", *sorted(LONG_CASES)]
)
def test_replayed_flow_is_the_walked_flow(images, name, shape, monkeypatch):
    """Stretches the fast loop replays from its cache give exactly what
    walking them again gives: block rows with their offsets and times,
    events, counts; across returns past the 64-entry return stack
    (``deep``) and returns that do not go where their call said
    (``unwind``), with time packets between the branches, and between
    tracing's disabling and enabling, PSB+ and cycle counts."""
    from hwtrace.pt.decode import DecodeOptions

    replayed_rows = _noting_code_tables(monkeypatch, "replayed_rows")
    run = _long_case(name) if name in LONG_CASES else gt.case(name, "-O2")
    image = image_of(images, run)
    enc = encode_path(run.ips, image, end_ip=run.end_ip, **REPLAY_SHAPES[shape](len(run.ips)))
    walked = decode_trace(enc.data, image, enc.config, DecodeOptions(replay=False))
    replayed = decode_trace(enc.data, image, enc.config)
    assert np.array_equal(replayed.instructions(), enc.expected)
    for column in ("block_ip", "block_ninsn", "block_offset", "block_time"):
        assert np.array_equal(getattr(replayed, column), getattr(walked, column)), column
    assert replayed.n_blocks == walked.n_blocks and replayed.n_insn == walked.n_insn
    assert [str(g) for g in replayed.gaps] == [str(g) for g in walked.gaps]
    assert [(o, str(e)) for o, e in replayed.events] == [(o, str(e)) for o, e in walked.events]
    counted = decode_trace(enc.data, image, enc.config, keep_blocks=False)
    assert counted.n_insn == walked.n_insn and counted.n_blocks == walked.n_blocks
    # The cache was used (and not without it), for most rows.
    assert replayed_rows[0] == 0
    assert replayed_rows[1] > replayed.blocks.n // 4 and replayed_rows[2] > 0


@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
@pytest.mark.parametrize("shape", ["events", "noret"])
@pytest.mark.parametrize("name", sorted(LONG_CASES))
def test_disabled_and_enabled_again_as_the_step_functions_have_it(images, name, shape, monkeypatch):
    """Tracing off and on again (FUP, TIP.PGD, MODE.EXEC, TIP.PGE, timing
    packets between them), which the fast loop applies itself, gives what
    the step functions give: the instructions and their times, every word
    of every event, and where each sits in the flow."""
    from hwtrace.pt.decode import DecodeOptions

    taken = _noting_code_tables(monkeypatch, "fast_off_on")
    run = _long_case(name)
    image = image_of(images, run)
    enc = encode_path(run.ips, image, end_ip=run.end_ip, **REPLAY_SHAPES[shape](len(run.ips)))
    sequences = enc.stats["async_disable"] + enc.stats["sync_disable"]
    assert enc.stats["async_disable"] > 20 and enc.stats["sync_disable"] > 10
    fast = decode_trace(enc.data, image, enc.config)
    steps = decode_trace(enc.data, image, enc.config, DecodeOptions(fast=False))
    # The fast loop took (nearly) all of them, the step functions none.
    assert taken[0] >= 0.9 * sequences and taken[1] == 0, (taken, sequences)
    _assert_same_flow(fast, steps, enc)


def _assert_same_flow(fast, steps, enc: EncodedTrace) -> None:
    """Two decodes of ``enc`` give its instructions, the same times, gaps and
    events, every word of them, each at the same place in the flow."""
    assert np.array_equal(fast.instructions(), enc.expected)
    assert np.array_equal(steps.instructions(), enc.expected)
    assert np.array_equal(fast.instruction_times(), steps.instruction_times())
    assert fast.n_insn == steps.n_insn
    assert [str(g) for g in fast.gaps] == [str(g) for g in steps.gaps]
    assert np.array_equal(fast.event_rows, steps.event_rows)
    assert np.array_equal(fast.event_offset, steps.event_offset)
    # (The fast loop's rows are runs, the step functions' blocks: an event's
    # place is the number of instructions before it.)
    at = [np.concatenate([[0], np.cumsum(r.block_ninsn, dtype=np.int64)]) for r in (fast, steps)]
    assert np.array_equal(at[0][fast.event_block], at[1][steps.event_block])


@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
def test_a_call_walked_to_where_tracing_goes_off_pushes_its_return(images, monkeypatch):
    """Tracing off right after a call (at its target) and on again where it
    returns: the walk to where tracing went off pushes the call's return
    address, so that the enable comes back there (F_RETURNED), in the fast
    loop as in the step functions."""
    from hwtrace.pt.decode import DecodeOptions
    from hwtrace.pt.encode import classify_path
    from hwtrace.pt.flowrows import E_FLAGS, E_TYPE, EV_ENABLED, F_RETURNED

    run = _long_case("mixed-long")  # (the case with calls enough)
    image = image_of(images, run)
    code = classify_path(run.ips, image)
    ips, spans, p = code.ips, [], 50
    while p < len(ips) - 2 and len(spans) < 40:
        u = code.uid[p]
        if code.push[u] and code.target[u] and ips[p + 1] == code.target[u]:
            back = np.flatnonzero(ips[p + 2 : p + 5000] == code.fall[u])
            if back.size:
                spans.append((p + 1, p + 2 + int(back[0])))
                p = spans[-1][1] + 200
                continue
        p += 1
    assert len(spans) >= 10
    taken = _noting_code_tables(monkeypatch, "fast_off_on")
    enc = encode_path(ips, image, end_ip=run.end_ip, tsc=1, mtc_freq=3, trace_off=spans)
    fast = decode_trace(enc.data, image, enc.config)
    steps = decode_trace(enc.data, image, enc.config, DecodeOptions(fast=False))
    _assert_same_flow(fast, steps, enc)
    assert taken[0] >= 0.9 * len(spans), (taken, len(spans))
    enabled = fast.event_rows[fast.event_rows[:, E_TYPE] == EV_ENABLED]
    assert np.count_nonzero(enabled[:, E_FLAGS] & F_RETURNED) >= len(spans)


@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
def test_no_stretch_is_recorded_from_where_tracing_comes_back_on(images, monkeypatch):
    """Where tracing comes back on inside straight-line code (as after an
    interrupt) the fast loop walks on without recording a stretch from
    there: such a stretch seldom comes again.  The flow is the step
    functions' all the same."""
    from hwtrace.pt._flowloop import cached_stretch_starts
    from hwtrace.pt.decode import DecodeOptions
    from hwtrace.pt.encode import C_OTHER, classify_path

    run = _long_case("mixed-long")
    image = image_of(images, run)
    code = classify_path(run.ips, image)
    ips = code.ips
    # The instructions only ever reached from a plain one before them (no
    # run starts there but where tracing comes back on).
    after_plain = np.ones(ips.shape[0], bool)
    after_plain[0] = False
    after_plain[1:] = code.cls[code.uid[:-1]] == C_OTHER
    inside = np.setdiff1d(ips[after_plain], ips[~after_plain])
    spans, p = [], 50
    while p < len(ips) - 400 and len(spans) < 60:
        q = p + 30 + int(np.flatnonzero(np.isin(ips[p + 30 : p + 400], inside))[0])
        spans.append((p, q))
        p = q + 300
    assert len(spans) >= 20
    starts = _noting(monkeypatch, lambda tables: [cached_stretch_starts(t) for t in tables])
    enc = encode_path(ips, image, end_ip=run.end_ip, tsc=1, mtc_freq=3, trace_off=spans)
    fast = decode_trace(enc.data, image, enc.config)
    steps = decode_trace(enc.data, image, enc.config, DecodeOptions(fast=False))
    _assert_same_flow(fast, steps, enc)
    cached = np.concatenate(starts[0])
    assert cached.size > 0
    # (The step functions may take a sequence, and the fast loop start
    # again where tracing came back on: a few such stretches.)
    resumed = np.unique(ips[[q for _, q in spans]])
    assert np.isin(resumed, cached).mean() < 0.1, np.intersect1d(resumed, cached)


@pytest.mark.skipif(decode_trace is None, reason=NO_HWTRACE)
@pytest.mark.parametrize("cyc", [False, True])
def test_a_psb_plus_in_the_flow_as_the_step_functions_have_it(images, cyc, monkeypatch):
    """A PSB+ in the middle of the flow, its FUP anywhere in straight-line
    code, which the fast loop takes itself where nobody keeps its status
    updates (the library), gives what the step functions give: the
    instructions, their times and trace offsets, the events and where
    each sits in the flow; with system calls between, and cycle counts."""
    from hwtrace.pt.decode import DecodeOptions

    taken = _noting_code_tables(monkeypatch, "fast_psb")
    run = _long_case("interp-long")
    image = image_of(images, run)
    enc = encode_path(
        run.ips, image, end_ip=run.end_ip, psb_period=256, tsc=1, mtc_freq=3, cyc=cyc,
        trace_off=_system_calls(len(run.ips), 400, 30),
    )  # fmt: skip
    psbs = enc.stats["psb"]
    assert psbs > 50
    fast = decode_trace(enc.data, image, enc.config)
    steps = decode_trace(enc.data, image, enc.config, DecodeOptions(fast=False))
    _assert_same_flow(fast, steps, enc)
    # (The fast loop's rows are runs, the step functions' blocks: each
    # instruction's offset is its row's.)
    offsets = [np.repeat(r.block_offset, r.block_ninsn) for r in (fast, steps)]
    assert np.array_equal(offsets[0], offsets[1])
    # The fast loop took most of them (not those that limit a window, nor
    # those with tracing off), the step functions none.
    assert taken[0] >= 0.8 * psbs and taken[1] == 0, (taken, psbs)
