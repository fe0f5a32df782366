"""Streaming the Intel PT of a perf.data (hwtrace.session.perfflow.stream_perf):
batch by batch it gives exactly the blocks, attribution, durations, gaps
and instructions that decode_perf keeps whole, whatever the batch size and
however the trace is split into AUXTRACE records; and ``hwtrace script`` /
``report`` print the same whether the trace is in one record or many."""

from __future__ import annotations

import itertools
from pathlib import Path

import groundtruth as gt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_perf_data import add_elf_mmaps

from hwtrace.cli.main import main
from hwtrace.columns import Deferred, OffsetPoints, SequencedKeys
from hwtrace.image import Image
from hwtrace.perf.data import read_perf_data
from hwtrace.perf.records import Comm, SampleId, SampleType
from hwtrace.perf.sideband import BinaryLocator
from hwtrace.perf.writer import INTEL_PT_CONFIG_BITS, PerfDataWriter
from hwtrace.pt.decode import chunk_ranges
from hwtrace.pt.encode import encode_path
from hwtrace.session.perfflow import PerfBlocks, decode_perf, stream_perf

pytestmark = pytest.mark.skipif(gt.skip_reason is not None, reason=str(gt.skip_reason))
PID = 4343
COLUMNS = ("ip", "ninsn", "ns", "duration", "tid", "pid", "image")


def _trace(copies: int) -> tuple[gt.Run, bytes, np.ndarray]:
    """The sort program's path as timed PT, with tracing off for stretches
    (so blocks end where tracing stopped), repeated ``copies`` times; and
    the instructions a decoder must give."""
    run = gt.case("sort", "-O2")
    image = Image()
    image.add_elf(run.elf, run.load_address)
    n = len(run.ips)
    enc = encode_path(
        run.ips, image, end_ip=run.end_ip, tsc=1_000_000, mtc_freq=3, psb_period=512,
        trace_off=[(n // 5, n // 4), (n // 2, n // 2 + 40)],
    )  # fmt: skip
    return run, enc.data * copies, np.tile(enc.expected, copies)


def _write(path: Path, run: gt.Run, pt: bytes, cuts: list[int]) -> None:
    """A per-thread perf.data of ``pt``, in AUXTRACE records cut at ``cuts``
    (multiples of 8: a record's data is padded to 8 bytes, so only there do
    the records join into the trace again; a cut may split a packet)."""
    bits = INTEL_PT_CONFIG_BITS
    st = SampleType
    with PerfDataWriter(path) as w:
        w.set_intel_pt(
            config=bits["pt"] | bits["branch"] | bits["tsc"],
            sample_type=st.IP | st.TID | st.TIME | st.IDENTIFIER,
            time_shift=1, time_mult=3, time_zero=5, cap_user_time_zero=True,
            tsc_ctc_ratio=(4, 1),
        )  # fmt: skip
        sid = SampleId(pid=PID, tid=PID, time=1)
        w.add_record(Comm(PID, PID, "sorter"), sample_id=sid)
        add_elf_mmaps(w, run.elf, PID, sid)
        w.finished_init()
        for a, b in itertools.pairwise([0, *cuts, len(pt)]):
            w.add_auxtrace(pt[a:b], tid=PID)
        w.finished_round()


def _streamed(path: Path, **kw) -> tuple[list[PerfBlocks], object]:
    got: list[PerfBlocks] = []
    flow = stream_perf(read_perf_data(path), got.append, BinaryLocator(buildid_dirs=()), **kw)
    return got, flow


@pytest.mark.parametrize(
    ("copies", "cuts", "batch_rows", "chunk_bytes"),
    [
        (1, [], 1 << 14, 1 << 20),
        (40, [1000, 1008, 2904, 7000], 50, 1024),
        (12, [1504], 1, 1 << 20),
        # (windows of 1 KiB, each a small batch of stored rows, and tracing
        # stopping in some: rows and events of several wait in the store)
        (40, [1000, 1008, 2904, 7000], 1 << 14, 1024),
    ],
)
@pytest.mark.parametrize(("runs", "deferred"), [(True, False), (False, False), (False, True)])
def test_stream_gives_what_decode_perf_keeps(tmp_path, copies, cuts, batch_rows, chunk_bytes, runs,
                                             deferred):  # fmt: skip
    """Also with ``runs=False``, where the decoder keeps its rows compactly
    and replays what it decoded before, the stream taking them from there;
    and ``deferred``, where a batch's keys and trace offsets are made by
    whoever takes it, from a copy of the store's compact form."""
    run, pt, expected = _trace(copies)
    path = tmp_path / "pt.data"
    _write(path, run, pt, cuts)
    whole = decode_perf(
        read_perf_data(path), BinaryLocator(buildid_dirs=()), chunk_bytes=chunk_bytes
    )
    got, flow = _streamed(path, batch_rows=batch_rows, chunk_bytes=chunk_bytes, runs=runs,
                          deferred=deferred)  # fmt: skip
    if deferred:
        # (made later, as a writer's thread makes them: the store has moved on)
        assert any(isinstance(b.keys, Deferred) for b in got)
        offsets = [b.offset for b in got]
        got = [b.resolved() for b in got]
        # (keys the store kept in sequences, trace offsets its offset
        # points, stay so, as the Parquet writer reads them; laid out when
        # asked)
        assert all(not isinstance(b.offset, Deferred) or isinstance(b.offset, OffsetPoints)
                   for b in got)  # fmt: skip
        assert any(isinstance(b.offset, OffsetPoints) for b in got)
        assert all(isinstance(b.keys, np.ndarray | SequencedKeys) for b in got)
        assert any(isinstance(b.keys, SequencedKeys) for b in got)
        compact, _ = _streamed(path, batch_rows=batch_rows, chunk_bytes=chunk_bytes, runs=False)
        assert [len(b) for b in compact] == [len(b) for b in got]
        for b, c, o in zip(got, compact, offsets, strict=True):
            np.testing.assert_array_equal(b.keys, c.keys)
            np.testing.assert_array_equal(np.asarray(b.offset), np.asarray(c.offset))
            np.testing.assert_array_equal(np.asarray(o), np.asarray(c.offset))
    assert not whole.problems and not flow.problems
    (q,) = whole.queues
    f = q.flow
    # A thread's queue: its thread and process throughout, as columns of
    # one value that take no memory per block.
    assert (q.block_tid == q.tid).all() and q.block_tid.strides == (0,)
    assert q.block_pid.strides == (0,) and not q.block_pid.flags.writeable
    want = {
        "ip": f.block_ip, "ninsn": f.block_ninsn, "ns": q.block_ns, "duration": q.block_duration,
        "tid": q.block_tid, "pid": q.block_pid,
        "image": np.zeros(f.block_ip.shape[0], int) if f.block_image is None else f.block_image,
    }  # fmt: skip
    assert all(0 < len(b) <= batch_rows for b in got)
    assert [b.row for b in got] == list(itertools.accumulate([0] + [len(b) for b in got[:-1]]))
    for c in COLUMNS:
        np.testing.assert_array_equal(np.concatenate([getattr(b, c) for b in got]), want[c], c)
    # Without the run asked for, a batch says which columns hold one value
    # (a per-thread queue's thread and process, the run), and they do.
    for b in got:
        if runs:
            assert not b.uniform
        elif b is not got[-1]:
            assert {"tid", "pid", "run"} <= b.uniform
        for c in b.uniform:
            v = np.asarray(getattr(b, c))  # (a column by key laid out)
            assert (v == v[0]).all(), c
        dense = b.dense()
        assert all(getattr(dense, c).flags.c_contiguous for c in COLUMNS)
        if b.keys is not None:
            # Each block named by its key into the decoder's table of
            # distinct blocks, the rows it stored and those it wrote out.
            for c in ("ip", "ninsn", "mode", "image"):
                np.testing.assert_array_equal(b.key_table[c][b.keys], getattr(b, c), c)
    # (all but the last block, passed on once the queue ends)
    assert all(b.keys is not None for b in got[:-1]) == (not runs)
    if not runs:
        # Blocks after which tracing stopped (a gap before the next), as
        # the stream that lays out every row marks them.
        laid, _ = _streamed(path, batch_rows=batch_rows, chunk_bytes=chunk_bytes, runs=True)
        gaps = np.concatenate([b.gap for b in got])
        assert gaps.any()
        np.testing.assert_array_equal(gaps, np.concatenate([b.gap for b in laid]))
    assert (q.block_duration > 0).any() and (q.block_ns >= 0).all()
    ips = np.concatenate([p.instructions() for b in got for p in b.split(97)])
    np.testing.assert_array_equal(ips, expected)
    np.testing.assert_array_equal(ips, q.instructions())
    assert [str(g) for g in flow.queues[0].gaps] == [str(g) for g in f.gaps] == []
    assert flow.queues[0].n_insn == len(expected)
    # Each record's data is padded to 8 bytes (PT PAD packets), as perf pads it.
    assert len(pt) <= flow.queues[0].trace_bytes < len(pt) + 8 * (len(cuts) + 1)


def test_a_full_store_is_passed_on_and_stored_into_again(tmp_path, monkeypatch):
    """A compact stream's decoder stops when its block store is full, for
    the stream to pass the stored rows on, and then stores (and replays)
    into it again: rows are not written out while the store is full."""
    from hwtrace.session import perfflow

    run, pt, expected = _trace(40)
    path = tmp_path / "pt.data"
    _write(path, run, pt, [])
    written, stored = [0], [0]
    batch = perfflow.QueueSink.batch

    def counted(self, b):
        written[0] += b.ip.shape[0]
        stored[0] += b.n_virtual
        batch(self, b)

    monkeypatch.setattr(perfflow.QueueSink, "batch", counted)
    got, _ = _streamed(path, batch_rows=1 << 12, runs=False)
    ips = np.concatenate([p.instructions() for b in got for p in b.split(97)])
    np.testing.assert_array_equal(ips, expected)
    total = sum(len(b) for b in got)
    # (several batches: the store filled again and again)
    assert len(got) > 3 and written[0] + stored[0] == total
    assert written[0] < total // 50, (written[0], total)


def test_stream_past_what_the_decoder_can_store(tmp_path, monkeypatch):
    """A compact stream whose store can no longer be stored into by the
    decoder (more distinct blocks than its keys hold) goes on with a new
    store, a new source of keys each time, the same flow."""
    from hwtrace.pt.blocks import BlockStore
    from hwtrace.session import perfflow

    run, pt, expected = _trace(40)
    path = tmp_path / "pt.data"
    _write(path, run, pt, [1000, 2904])
    clear = BlockStore.clear

    def widened(self):
        clear(self)
        self.keys = self.keys.astype(np.uint32)  # (as past 65,535 distinct blocks)
        self._kernel_store = None

    monkeypatch.setattr(BlockStore, "clear", widened)
    sinks = []
    init = perfflow.QueueSink.__init__

    def keep(self, *a, **kw):
        init(self, *a, **kw)
        sinks.append(self)

    monkeypatch.setattr(perfflow.QueueSink, "__init__", keep)
    got, _ = _streamed(path, batch_rows=1 << 14, runs=False)
    assert sinks and sinks[0].store is not None
    assert len({b.key_source for b in got if b.keys is not None}) > 1
    ips = np.concatenate([p.instructions() for b in got for p in b.split(97)])
    np.testing.assert_array_equal(ips, expected)


def test_a_store_outgrown_while_it_holds_rows_passes_them_on_at_once(tmp_path, monkeypatch):
    """A store whose distinct blocks outgrow two-byte keys while it holds
    rows (a real program's code) takes no more of the decoder's rows: they
    are passed on from the store at the decoder's next stop and a new store
    takes the rows after, where a batch's worth used to come laid out and
    be attributed a row at a time.  The same flow."""
    from hwtrace.session import perfflow

    run, pt, expected = _trace(40)
    path = tmp_path / "pt.data"
    _write(path, run, pt, [])
    output = perfflow.QueueSink.output
    widened = []

    def outgrow(self):
        store = self.store
        if not widened and store is not None and store.live and len(store) > 1000:
            store.keys = store.keys.astype(np.uint32)  # (as past 65,535 distinct blocks)
            store._kernel_store = None
            widened.append(len(store))
        return output(self)

    laid_out = []
    attribute = perfflow.QueueSink._attribute

    def count(self, batch=None, stored=False):
        laid_out.append(self.n_parts if batch is None else batch["ip"].shape[0])
        return attribute(self, batch, stored)

    monkeypatch.setattr(perfflow.QueueSink, "output", outgrow)
    monkeypatch.setattr(perfflow.QueueSink, "_attribute", count)
    # (small windows: the decoder stops often, as on a real program's trace)
    got, _ = _streamed(path, batch_rows=1 << 20, runs=False, deferred=True, window_bytes=1024,
                       chunk_bytes=1024)  # fmt: skip
    assert widened and sum(len(b) for b in got) > 3 * widened[0]
    # (rows laid out: at most what the decoder writes out between two
    # stops, 4096, once or twice)
    assert sum(laid_out) <= 2 * (1 << 12)
    ips = np.concatenate([p.instructions() for b in got for p in b.split(97)])
    np.testing.assert_array_equal(ips, expected)


@pytest.mark.parametrize("runs", [True, False])
def test_stream_reports_gaps_where_decode_perf_does(tmp_path, runs):
    run, pt, _ = _trace(10)
    bad = bytearray(pt)
    bad[len(pt) // 3 : len(pt) // 3 + 64] = b"\xd9" * 64  # no packet starts with 0xd9
    path = tmp_path / "bad.data"
    _write(path, run, bytes(bad), [len(pt) // 2])
    whole = decode_perf(read_perf_data(path), BinaryLocator(buildid_dirs=()))
    got, flow = _streamed(path, batch_rows=100, runs=runs)
    gaps = [str(g) for g in whole.queues[0].flow.gaps]
    assert gaps and [str(g) for g in flow.queues[0].gaps] == gaps
    np.testing.assert_array_equal(
        np.concatenate([b.duration for b in got]), whole.queues[0].block_duration
    )


def test_chunk_ranges_start_at_psbs_and_cover_the_trace():
    _, pt, _ = _trace(20)
    buf = np.frombuffer(pt, np.uint8)
    ranges = chunk_ranges(buf, 512)
    assert len(ranges) > 3
    psb = bytes.fromhex("0282") * 8
    assert all(pt[s : s + 16] == psb for s, _ in ranges)
    assert ranges[-1][1] == len(pt)
    for (_, e), (s2, _) in itertools.pairwise(ranges):
        assert s2 < e <= s2 + 4096  # each runs on through the next one's PSB+


def _ranges_of_whole_buffer(buf: np.ndarray, chunk: int) -> list[tuple[int, int]]:
    """The ranges as found in one buffer: psb_chunks, then each but the
    last run on through the next one's PSB+."""
    from hwtrace.pt.packets import psb_chunks, psb_plus_end

    ranges = psb_chunks(buf, chunk)
    return [(s, psb_plus_end(buf, e, missing=e) if i + 1 < len(ranges) else e)
            for i, (s, e) in enumerate(ranges)]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_chunk_ranges_read_in_windows_equal_the_whole_buffer_s(data):
    """A queue split over AUXTRACE records is cut into ranges reading only
    windows near each cut (no copy of the whole queue): the same ranges as
    in one buffer, also with garbage, runs of PSB bytes longer than a PSB
    at any alignment, and a cut PSB+ at the end."""
    from hwtrace.pt.decode import chunk_ranges_of

    pt = bytearray(_TRACE[: data.draw(st.integers(1000, len(_TRACE)))])
    for _ in range(data.draw(st.integers(0, 6))):
        at = data.draw(st.integers(0, len(pt)))
        junk = data.draw(
            st.sampled_from(
                [
                    bytes.fromhex("0282") * data.draw(st.integers(1, 40)),
                    data.draw(st.binary(min_size=1, max_size=300)),
                ]
            )
        )
        pt[at:at] = junk
    buf = np.frombuffer(bytes(pt), np.uint8)
    cuts = sorted(data.draw(st.lists(st.integers(1, len(pt) - 1), max_size=8, unique=True)))
    parts = np.split(buf, cuts)
    ends = np.cumsum([p.shape[0] for p in parts])

    def read(lo: int, hi: int) -> np.ndarray:
        first = int(np.searchsorted(ends, lo, side="right"))
        got = np.concatenate(parts[first:])[lo - int(ends[first] - parts[first].shape[0]) :]
        return got[: hi - lo]

    chunk = data.draw(st.sampled_from([300, 512, 2000]))
    window = data.draw(st.sampled_from([256, 333, 4096]))
    assert chunk_ranges_of(read, len(pt), chunk, window) == _ranges_of_whole_buffer(buf, chunk)
    assert chunk_ranges(buf, chunk) == _ranges_of_whole_buffer(buf, chunk)


_TRACE = _trace(12)[1] if gt.skip_reason is None else b""


def test_script_and_report_same_from_one_record_or_many(tmp_path, capsysbinary):
    run, pt, expected = _trace(6)
    outputs = []
    for name, cuts in (("one", []), ("many", [8, 296, 304, 1000, len(pt) - len(pt) % 8 - 8])):
        path = tmp_path / f"{name}.data"
        _write(path, run, pt, cuts)
        texts = []
        for cmd in (
            ["script"],
            ["script", "--blocks"],
            ["report", "--folded", str(tmp_path / f"{name}.f")],
        ):
            assert main([*cmd, "-i", str(path)]) == 0
            out, _ = capsysbinary.readouterr()
            texts.append(out.replace(str(path).encode(), b"IN").replace(name.encode(), b"X"))
        texts.append((tmp_path / f"{name}.f").read_bytes())
        outputs.append(texts)
    assert outputs[0] == outputs[1]
    script, _, report, folded = outputs[0]
    assert script.count(b"\n") == len(expected)
    assert b"sorter" in report and b"0 gap(s)" in report and folded.startswith(b"sorter;")


def test_a_store_outgrown_is_followed_by_a_new_one_naming_the_held_block():
    """A store whose blocks outgrew two-byte keys (a real program's code,
    after some millions of rows) cannot take the decoder's rows: once it
    has passed its rows on, the stream gives the decoder a new store (a
    new source of keys, its rows kept compactly again), and the block held
    for the next batch is named in it."""
    from hwtrace.pt.blocks import BlockStore
    from hwtrace.session.perfflow import QueueSink

    old = BlockStore(expect_rows=16)
    n = 70_000
    many = np.arange(n, dtype=np.uint64) * np.uint64(16) + np.uint64(0x100000)
    old.row_keys(many, np.ones(n, np.uint32), np.full(n, 64, np.uint8), np.zeros(n, np.int64),
                 np.zeros(n, np.uint32))  # fmt: skip
    assert not old.live and not len(old)
    sink = QueueSink.__new__(QueueSink)
    sink.store, sink.store_rows = old, 1 << 12
    sink.held = {"key": np.array([n - 1], np.uint32), "ip": many[-1:], "ninsn": np.array([1]),
                 "mode": np.array([64], np.uint8), "image": np.array([0])}  # fmt: skip
    sink._new_store()
    new = sink.store
    assert new is not old and new.live and new.number != old.number
    key = sink.held["key"]
    assert key.dtype == np.uint16 and key.shape == (1,)
    t = new.table()
    assert int(t["ip"][key[0]]) == int(many[-1]) and int(t["ninsn"][key[0]]) == 1
