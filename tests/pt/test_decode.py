"""The library decoder: the compiled decoder against the interpreted reference.

Every core conformance trace (Intel's own corner cases: deferred TIPs,
return compression, overflows, errata, paging, power events, ...) is
decoded by the compiled decoder, with and without its fast loop, and by the
interpreted reference decoders, and all must give the same instructions,
block times, events and gaps.  Chunked and threaded decoding must give the
single-pass result.
"""

import json
import os

import numpy as np
import pytest
from conftest import CONFORMANCE
from oracles.decode import decode_reference
from oracles.decode import instructions as reference_instructions

from hwtrace.image import Image
from hwtrace.pt.config import PtConfig
from hwtrace.pt.decode import DecodeOptions, FlowResult, decode_trace, iter_flow
from hwtrace.pt.flowdec import FlowDecoder


def _cases():
    manifest = CONFORMANCE / "manifest.json"
    if not manifest.exists():
        return []
    cases = json.loads(manifest.read_text())["cases"]
    out = []
    for case in cases:
        if case["suite"] != "core":
            continue
        binary = CONFORMANCE / "cases" / case["bin"]
        if binary.exists() and binary.stat().st_size:
            out.append(case)
    return out


CASES = _cases()


def _image(case) -> Image:
    img = Image()
    img.add_raw_spec(f"{CONFORMANCE / 'cases' / case['bin']}:{case['org']}")
    return img


def _same(a: FlowResult, b: FlowResult) -> None:
    ia = a.instructions() if not hasattr(a, "reference_cache") else reference_instructions(a)
    ib = b.instructions() if not hasattr(b, "reference_cache") else reference_instructions(b)
    assert np.array_equal(ia, ib)
    assert np.array_equal(a.instruction_times(), b.instruction_times())
    assert [str(g) for g in a.gaps] == [str(g) for g in b.gaps]
    assert [(o, e.type, e.ip) for o, e in a.events] == [(o, e.type, e.ip) for o, e in b.events]
    ea, eb = a.event_columns(), b.event_columns()
    for name in ("type", "ip", "time", "offset"):
        assert np.array_equal(ea[name], eb[name]), name
    # Events sit at the same place in the instruction flow.
    starts_a = np.concatenate([[0], np.cumsum(a.block_ninsn, dtype=np.int64)])
    starts_b = np.concatenate([[0], np.cumsum(b.block_ninsn, dtype=np.int64)])
    assert np.array_equal(starts_a[ea["block"]], starts_b[eb["block"]])


@pytest.mark.skipif(not CASES, reason=f"conformance suite not found at {CONFORMANCE}")
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_compiled_decoder_agrees_with_reference(case, monkeypatch):
    img = _image(case)
    pt = CONFORMANCE / "cases" / case["pt"]
    ref = decode_reference(np.fromfile(pt, np.uint8), img, PtConfig())
    fast = decode_trace(pt, img, PtConfig(), DecodeOptions(fast=True))
    slow = decode_trace(pt, img, PtConfig(), DecodeOptions(fast=False))
    _same(fast, ref)
    _same(slow, ref)
    # Packets read a PSB period at a time: the same.  (The flow loop opens
    # a buffer's windows itself, one after the other; a file's 16 at a
    # time, Python letting their pages go in between.)
    monkeypatch.setattr(FlowDecoder, "window_bytes", 1)
    _same(decode_trace(pt, img, PtConfig()), ref)
    data = pt.read_bytes()
    _same(decode_trace(data, img, PtConfig()), ref)
    # Windows opened the long way (the packet and time loops called one by
    # one, their tables made between them), not in one compiled call.
    compiled = FlowDecoder._open_compiled
    monkeypatch.setattr(FlowDecoder, "_open_compiled", lambda *args: None)
    _same(decode_trace(pt, img, PtConfig()), ref)
    # Both ways in turn: a compiled window starts from the time model's
    # state the long way left, and the other way round.
    turn = iter(range(1 << 30))
    monkeypatch.setattr(
        FlowDecoder, "_open_compiled",
        lambda self, *args: compiled(self, *args) if next(turn) % 2 else None,
    )  # fmt: skip
    _same(decode_trace(data, img, PtConfig()), ref)


def test_instructions_follow_direct_branches(tmp_path):
    # 0x1000: jmp +2; (2 bytes skipped) ; nop ; jmp back is traced by nothing.
    code = bytes.fromhex("eb02cccc90e9f6ffffff")
    img = Image()
    path = tmp_path / "code.bin"
    path.write_bytes(code)
    img.add_raw_spec(f"{path}:0x1000")
    res = FlowResult(
        np.array([0x1000], np.uint64),
        np.array([5], np.uint32),
        np.zeros(1, np.uint64),
        np.zeros(1, np.int64),
    )
    from hwtrace.pt.flowrows import CodeTable, CodeView

    table = CodeTable(img)
    table.fill(0x1000, 64)
    table.fill(0x1004, 64)
    res.code = {0: [CodeView(table)]}
    assert res.instructions().tolist() == [0x1000, 0x1004, 0x1005, 0x1000, 0x1004]


def test_empty_trace_has_nothing():
    res = decode_trace(b"", Image())
    assert res.n_insn == 0 and res.n_blocks == 0 and res.gaps == []
    assert list(iter_flow(b"", Image())) == []


@pytest.mark.skipif(not CASES, reason=f"conformance suite not found at {CONFORMANCE}")
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_chunked_and_threaded_decoding_agree(case):
    # A chunk at every PSB is the hardest split: each chunk's flow must end
    # exactly where the next chunk's PSB+ says execution was.
    img = _image(case)
    pt = CONFORMANCE / "cases" / case["pt"]
    whole = decode_trace(pt, img)
    chunked = decode_trace(pt, img, chunk_bytes=1)
    threaded = decode_trace(pt, img, chunk_bytes=1, jobs=2, job_bytes=0)
    _same(whole, chunked)
    _same(whole, threaded)
    streamed = list(iter_flow(pt, img, chunk_bytes=1))
    ips = [r.instructions() for r in streamed]
    joined = np.concatenate(ips) if ips else np.zeros(0, np.uint64)
    assert np.array_equal(joined, whole.instructions())


def test_threads_only_where_they_pay():
    from hwtrace.pt.decode import MIN_BYTES_PER_JOB, useful_jobs

    cpus = len(os.sched_getaffinity(0))
    assert useful_jobs(4, 100) == 1
    assert useful_jobs(4, 2 * MIN_BYTES_PER_JOB) == min(2, cpus)
    assert useful_jobs(1, 100 * MIN_BYTES_PER_JOB) == 1
    assert useful_jobs(64, 100 * MIN_BYTES_PER_JOB) == cpus
    assert useful_jobs(2, 100, job_bytes=0) == min(2, cpus)


def _sort_repeated(times: int):
    """The ground-truth sort program's run ``times`` over, an interrupt back
    to its start each time: ``(run, image, ips, interrupts)``."""
    import groundtruth as gt

    if gt.skip_reason is not None:
        pytest.skip(str(gt.skip_reason))
    run = gt.case("sort", gt.OPT_LEVELS[0])
    img = Image()
    img.add_elf(run.elf, run.load_address)
    n = len(run.ips)
    ips = np.concatenate([run.ips] * times)
    return run, img, ips, [(n * i, run.end_ip) for i in range(1, times)]


def test_windows_carry_the_time_model_across(monkeypatch):
    """A trace with cycle-accurate times (CYC, calibrated across PSBs) is
    decoded window by window, each window's time model starting from the
    state the last one left at its limit: the same blocks and times in one
    window, in a PSB period each (opened by the flow loop itself, the trace
    being in memory), opened from Python, and opened both ways in turn."""
    from hwtrace.pt.encode import encode_path

    run, img, ips, again = _sort_repeated(4)
    cycles = (np.arange(ips.shape[0]) % 7 + 1).astype(np.int64)
    enc = encode_path(ips, img, end_ip=run.end_ip, interrupts=again, tsc=1 << 30, mtc_freq=3,
                      cyc=True, ctc_ratio=2, cycles=cycles, psb_period=300)  # fmt: skip

    def columns(res: FlowResult) -> dict:
        return {c: res.blocks.column(c) for c in ("ip", "ninsn", "offset", "time")}

    whole = decode_trace(enc.data, img, enc.config)
    assert np.array_equal(whole.instructions(), enc.expected)
    want = columns(whole)
    assert np.unique(want["time"]).shape[0] > 200  # (times of their own, not the PSBs')
    monkeypatch.setattr(FlowDecoder, "window_bytes", 1)
    compiled = FlowDecoder._open_compiled
    turn = iter(range(1 << 30))
    for opener in (
        compiled,
        lambda *args: None,
        lambda self, *args: compiled(self, *args) if next(turn) % 2 else None,
    ):
        monkeypatch.setattr(FlowDecoder, "_open_compiled", opener)
        got = columns(decode_trace(enc.data, img, enc.config))
        for name, col in want.items():
            assert np.array_equal(got[name], col), name


def test_rows_stored_by_the_decoder_are_the_rows_python_stores(monkeypatch):
    """The decoder stores block rows in the result's store itself while the
    store has room (and undoes them with a step it redoes); the rows are
    the same as when every row goes through Python's append, also when the
    store starts too small and must grow on the way."""

    from hwtrace.pt import blocks
    from hwtrace.pt import decode as decode_mod
    from hwtrace.pt.encode import encode_path

    # The program sixteen times over (an interrupt back to its start each
    # time): more rows than a store starts with room for.
    run, img, ips, again = _sort_repeated(16)
    n = len(run.ips)
    enc = encode_path(ips, img, end_ip=run.end_ip, trace_off=[(n // 3, n // 3 + 30)],
                      interrupts=[(n // 2, int(run.ips[n // 2])), *again], tsc=1 << 30,
                      mtc_freq=3, psb_period=200)  # fmt: skip

    def columns(res: FlowResult) -> dict:
        return {c: res.blocks.column(c) for c in ("ip", "ninsn", "mode", "image", "offset", "time")}

    direct = decode_trace(enc.data, img, enc.config)
    assert np.array_equal(direct.instructions(), enc.expected)
    assert direct.n_blocks > 1 << 12  # more than the smallest store's rows
    monkeypatch.setattr(decode_mod, "_expected_rows", lambda size: 1)
    written = [0]
    batch = decode_mod._Collector.batch

    def counted(self, b):
        written[0] += b.ip.shape[0]
        batch(self, b)

    monkeypatch.setattr(decode_mod._Collector, "batch", counted)
    small = decode_trace(enc.data, img, enc.config)
    # (a full store stops the decoder for Python to grow it, and the
    # decoder stores into it again: rows are not written out meanwhile)
    assert written[0] < small.n_blocks // 50, (written[0], small.n_blocks)
    monkeypatch.setattr(blocks.BlockStore, "kernel_store", lambda self: blocks.dummy_store())
    by_python = decode_trace(enc.data, img, enc.config)
    for res in (small, by_python):
        for name, col in columns(res).items():
            assert np.array_equal(col, columns(direct)[name]), name
        _same(res, direct)


def test_event_columns_grow_past_their_room():
    from hwtrace.pt import flowrows as R
    from hwtrace.pt.decode import _EventColumns

    cols = _EventColumns(4)
    expect_rows, expect_offsets, expect_blocks = [], [], []
    for batch in range(5):
        rows = np.arange(3 * R.EW, dtype=np.uint64).reshape(3, R.EW) + 100 * batch
        rows[:, R.E_TYPE] = 1
        rows[:, R.E_FLAGS] = 0
        if batch % 2:
            rows[1, R.E_TYPE] = R.X_ERROR  # a marker
        if batch == 3:
            rows[2, R.E_FLAGS] = R.F_STATUS  # a status update
        offsets = np.array([10, 11, 12], np.int64) + batch
        blocks = np.array([0, 1, 2], np.int64)
        real = R.flow_events(rows)
        # (Written where the decoder writes them, then committed: markers
        # and status updates among them dropped, the rows after moved down.)
        at_rows, at_offsets, at_blocks = cols.room(3)
        assert at_offsets.shape[0] >= 3
        at_rows[:3], at_offsets[:3], at_blocks[:3] = rows, offsets, blocks
        cols.commit(3, 7 * batch)
        expect_rows.append(rows[real])
        expect_offsets.append(offsets[real])
        expect_blocks.append(blocks[real] + 7 * batch)
    got_rows, got_offsets, got_blocks = cols.columns()
    assert np.array_equal(got_rows, np.concatenate(expect_rows))
    assert np.array_equal(got_offsets, np.concatenate(expect_offsets))
    assert np.array_equal(got_blocks, np.concatenate(expect_blocks))


@pytest.mark.parametrize("fast", [True, False])
def test_tracing_back_at_the_return_address_is_no_gap(fast):
    """A call whose callee runs untraced (tracing off at its entry, as an
    address filter leaves it) and on again at the call's return address:
    the enable says so (F_RETURNED, on the fast path and the step
    functions' alike) and the flow has no gap there; on again anywhere
    else it has one."""
    from hwtrace.image.sections import Section
    from hwtrace.pt import flowrows as R
    from hwtrace.pt.encode import encode_path

    # call f; nop; jmp back to the call ... f: nop; ret
    code = bytes.fromhex("e80b00000090ebf8") + bytes(8) + bytes.fromhex("90c3")
    base = 0x400000
    image = Image()
    image.add_section(Section.from_bytes(code, base))
    loop = [base, base + 0x10, base + 0x11, base + 5, base + 6]
    ips = np.array(loop * 4, np.uint64)
    cases = {
        # (untraced: the callee's two instructions of the second round)
        "returned": ([(6, 8)], False),
        # (untraced: the callee and the nop after its return)
        "elsewhere": ([(6, 9)], True),
    }
    for name, (off, gap) in cases.items():
        enc = encode_path(ips, image.read, end_ip=base, trace_off=off, tsc=1 << 30, mtc_freq=3)
        got = decode_trace(enc.data, image, enc.config, options=DecodeOptions(fast=fast))
        assert np.array_equal(got.instructions(), enc.expected), name
        rows = got.event_rows
        types = rows[:, R.E_TYPE].tolist()
        on, off_ = R.EV_ENABLED, R.EV_DISABLED
        assert types == [on, off_, on, off_], name
        assert [bool(f & R.F_RETURNED) for f in rows[:, R.E_FLAGS]] == [
            False, False, not gap, False
        ], name  # fmt: skip
        # (the last stop, where the trace ends, is one)
        assert R.gap_events(rows).tolist() == [False, gap, False, True], name


def _cyc_trace():
    """The sort program's run twice over, tracing off for a stretch of it,
    encoded with a CYC before most packets: ``(encoded, image)``."""
    from hwtrace.pt.encode import encode_path

    run, img, ips, again = _sort_repeated(2)
    n = len(run.ips)
    cycles = (np.arange(ips.shape[0]) % 5 + 1).astype(np.int64)
    enc = encode_path(ips, img, end_ip=run.end_ip, interrupts=again,
                      trace_off=[(n // 3, n // 3 + 30)], tsc=1 << 30, mtc_freq=3, cyc=True,
                      ctc_ratio=2, cycles=cycles, psb_period=512)  # fmt: skip
    return enc, img


def test_a_cyc_and_the_tnt_after_it_are_one_row_of_a_window():
    """The flow decoder's windows take a CYC and the TNT-8 right after it as
    one row (TNT8_AFTER_CYC): the CYC's offset, both packets' size, the
    TNT's bits and their number, the CYC's cycles above them.  Packet
    tables never do."""
    from hwtrace.pt._state import ROWS_FOLD_CYC
    from hwtrace.pt.kinds import TNT8_AFTER_CYC, Kind
    from hwtrace.pt.packets import as_buffer, decode_range

    enc, _ = _cyc_trace()
    buf = as_buffer(enc.data)
    plain = decode_range(buf, 0, buf.shape[0])
    folded = decode_range(buf, 0, buf.shape[0], errata=ROWS_FOLD_CYC)
    assert TNT8_AFTER_CYC not in set(plain.kind.tolist())
    cyc = np.flatnonzero((plain.kind[:-1] == Kind.CYC) & (plain.kind[1:] == Kind.TNT8))
    assert cyc.shape[0] > 50
    want = {name: getattr(plain, name).copy() for name in ("offset", "kind", "size", "a", "b", "c")}
    tnt = cyc + 1
    want["kind"][cyc] = TNT8_AFTER_CYC
    want["size"][cyc] += want["size"][tnt]
    want["b"][cyc] = want["b"][tnt] | (want["a"][cyc].astype(np.uint32) << 8)
    want["a"][cyc] = want["a"][tnt]
    for name, col in want.items():
        assert np.array_equal(getattr(folded, name), np.delete(col, tnt)), name


def _splice(data: bytes, at: int, insert: bytes) -> bytes:
    return data[:at] + insert + data[at:]


def test_a_cyc_folded_into_a_tnt_decodes_as_the_two_packets(monkeypatch):
    """The flow decoder gives the same blocks, times, events and gaps with
    a CYC and the TNT-8 after it in one row as with a row each, on a
    cycle-accurate trace, on corrupt ones where that TNT is an error
    (inside a PSB+, while tracing is off: the error is at the TNT's offset,
    past the CYC, as libipt has it) and with bytes flipped anywhere."""
    from hwtrace.pt import flowdec
    from hwtrace.pt.kinds import Kind
    from hwtrace.pt.packets import as_buffer, decode_range

    enc, img = _cyc_trace()
    table = decode_range(as_buffer(enc.data), 0, len(enc.data))
    cyc_tnt = bytes([0x03 | (5 << 3), 0x06])  # CYC(5), TNT-8 of one bit
    psbend = int(table.offset[np.flatnonzero(table.kind == Kind.PSBEND)[3]])
    pgd = np.flatnonzero(table.kind == Kind.TIP_PGD)
    assert pgd.shape[0] >= 1
    after_pgd = int(table.offset[pgd[0]] + table.size[pgd[0]])
    spliced = [_splice(enc.data, psbend, cyc_tnt), _splice(enc.data, after_pgd, cyc_tnt)]
    # And bytes flipped anywhere (the decoder keeps going after each error).
    rng = np.random.default_rng(7)
    flipped = []
    for _ in range(12):
        data = bytearray(enc.data)
        for at in rng.integers(0, len(data), 4):
            data[at] ^= int(rng.integers(1, 256))
        flipped.append(bytes(data))
    gaps = 0
    for data in [enc.data, *spliced, *flipped]:
        got = decode_trace(data, img, enc.config)
        monkeypatch.setattr(flowdec, "ROWS_FOLD_CYC", 0)
        want = decode_trace(data, img, enc.config)
        monkeypatch.undo()
        _same(got, want)
        for name in ("ip", "ninsn", "offset", "time"):
            assert np.array_equal(got.blocks.column(name), want.blocks.column(name)), name
        gaps += len(got.gaps)
    assert gaps >= len(spliced) + len(flipped)
