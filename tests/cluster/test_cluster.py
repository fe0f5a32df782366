"""hwtrace.cluster: a perf.data's Intel PT decoded by Dask tasks gives exactly
stream_perf's rows, in this process, on a local cluster, on a loopback
``dask scheduler`` with two ``dask worker`` processes, and after a worker
is killed; a silent address and an input the workers cannot read are one
line each."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_ptw_flow import built  # noqa: F401 (a fixture)
from test_ptw_flow import recorded as ptw_recording  # noqa: F401 (a fixture)
from test_record_software import SKIP

from hwtrace.cli.main import main as hwtrace_main
from hwtrace.cluster import DistributedError, decode_distributed, plan_pieces
from hwtrace.perf.data import read_perf_data
from hwtrace.perf.intelpt import iter_queue_traces
from hwtrace.session.perfflow import stream_perf

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

COLUMNS = ("ip", "ninsn", "mode", "ns", "duration", "tid", "pid", "image", "run", "gap")
SMALL = {"task_bytes": 4096, "chunk_bytes": 4096}  # many pieces of a small trace


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    """Four threads recorded by ``hwtrace record``: four queues of 5-100 KiB
    of trace, a PSB every 4 KiB."""
    from test_record_threads import WORKS, build

    exe = build()
    path = tmp_path_factory.mktemp("dist") / "perf.data"
    args = [a for w in WORKS[:4] for a in ("-f", w)]
    assert (
        hwtrace_main(
            ["record", "--backend", "step", "-o", str(path), *args, "--", str(exe), "four"]
        )
        == 0
    )
    return path


def collect(decode) -> tuple[dict[int, dict[str, np.ndarray]], object, list[int]]:
    """Per queue, each column of the batches ``decode(on_blocks)`` hands
    on, joined; the returned stream; queues in the order they came."""
    parts: dict[int, dict[str, list]] = {}
    seen: list[int] = []

    def on_blocks(b) -> None:
        if not seen or seen[-1] != b.queue.index:
            seen.append(b.queue.index)
        d = parts.setdefault(b.queue.index, {c: [] for c in (*COLUMNS, "row", "offset", "ptw")})
        d["row"].append(np.arange(len(b)) + b.row)
        d["offset"].append(b.offset)
        for c in COLUMNS:
            d[c].append(getattr(b, c))
        d["ptw"].append(0 if b.ptw is None else len(b.ptw))

    stream = decode(on_blocks)
    cols = {
        q: {c: (np.concatenate(v) if c != "ptw" else sum(v)) for c, v in d.items()}
        for q, d in parts.items()
    }
    return cols, stream, seen


@pytest.fixture(scope="module")
def expected(recording):
    return collect(lambda on: stream_perf(read_perf_data(recording), on))


def same(got, want) -> None:
    cols, stream, seen = got
    wcols, wstream, wseen = want
    assert seen == wseen == sorted(wseen)  # queue by queue, in order
    assert sorted(cols) == sorted(wcols)
    for q, w in wcols.items():
        assert w["ip"].shape[0] > 0
        for c in (*COLUMNS, "row", "offset"):
            assert cols[q][c].dtype == w[c].dtype, (q, c)
            np.testing.assert_array_equal(cols[q][c], w[c], err_msg=f"queue {q}, {c}")
        assert cols[q]["ptw"] == w["ptw"]
    assert len(stream.queues) == len(wstream.queues)
    for a, b in zip(stream.queues, wstream.queues, strict=True):
        assert (a.cpu, a.tid, a.trace_bytes, a.n_insn, a.n_blocks) == (
            b.cpu, b.tid, b.trace_bytes, b.n_insn, b.n_blocks)  # fmt: skip
        assert [str(g) for g in a.gaps] == [str(g) for g in b.gaps]
        assert [im.name for im in a.images] == [im.name for im in b.images]
        for i in range(len(b.images)):
            # The code runs the ``run`` column numbers, numbered alike.
            ta, tb = a.code_table(i), b.code_table(i)
            assert ta.n_runs == tb.n_runs
            np.testing.assert_array_equal(ta.r_ip[: ta.n_runs], tb.r_ip[: tb.n_runs])
            np.testing.assert_array_equal(ta.r_ninsn[: ta.n_runs], tb.r_ninsn[: tb.n_runs])
    assert stream.problems == wstream.problems


def test_many_pieces_in_process(recording, expected):
    data = read_perf_data(recording)
    pieces = [plan_pieces(t, **SMALL) for _, _, t in iter_queue_traces(data)]
    assert len(pieces) >= 2 and sum(map(len, pieces)) >= 20
    same(collect(lambda on: decode_distributed(str(recording), on, **SMALL)), expected)


def test_corrupt_chunk_gaps_as_stream_perf(recording, tmp_path):
    """Bytes of a trace overwritten: the same gaps and the same rows."""
    bad = tmp_path / "bad.data"
    raw = bytearray(recording.read_bytes())
    data = read_perf_data(recording)
    _, _, trace = next(iter_queue_traces(data))
    n = trace.shape[0]
    aux = data.auxtrace_columns()
    start = int(aux["data_offset"][np.argmax(aux["size"])])
    for at in (start + 6000, start + 20000):
        raw[at : at + 64] = bytes([0xD9]) * 64
    bad.write_bytes(bytes(raw))
    want = collect(lambda on: stream_perf(read_perf_data(bad), on))
    assert want[1].n_gaps > 0 and n > 0
    same(collect(lambda on: decode_distributed(str(bad), on, **SMALL)), want)


def test_local_cluster(recording, expected):
    same(collect(lambda on: decode_distributed(str(recording), on, workers=2, **SMALL)), expected)


def test_silent_address_is_one_line(recording):
    port = _free_port()
    with pytest.raises(DistributedError) as e:
        decode_distributed(str(recording), lambda b: None, cluster=f"tcp://127.0.0.1:{port}",
                           connect_timeout=2)  # fmt: skip
    msg = str(e.value)
    assert "\n" not in msg and f"127.0.0.1:{port}" in msg and "no Dask scheduler" in msg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    """``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1,
    the workers in a directory of their own; killed afterwards."""
    from distributed import Client

    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    worker = [sys.executable, "-m", "distributed.cli.dask_worker"]
    cwd = tmp_path_factory.mktemp("workers")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([*dask, "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], **quiet)]  # fmt: skip
    try:
        for _ in range(2):
            procs.append(subprocess.Popen(
                [*worker, address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                 "--host", "127.0.0.1"], cwd=cwd, **quiet))  # fmt: skip
        with Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
        workers = procs[1:]
        yield address, workers
        procs += workers[2:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_loopback_cluster(recording, expected, loopback):
    address, _ = loopback
    got = collect(lambda on: decode_distributed(str(recording), on, cluster=address, **SMALL))
    same(got, expected)


def test_input_workers_cannot_read_is_one_line(recording, loopback, monkeypatch):
    """A relative path: the client reads it, the workers (elsewhere) cannot."""
    address, _ = loopback
    monkeypatch.chdir(recording.parent)
    with pytest.raises(DistributedError) as e:
        decode_distributed("perf.data", lambda b: None, cluster=address, **SMALL)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("worker tcp://127.0.0.1:")
    assert "cannot read perf.data" in msg
    # The client it connected is closed (no client left to reconnect to
    # the scheduler once it is gone).
    from distributed import default_client

    with pytest.raises(ValueError):
        default_client()


def test_worker_killed_mid_run(recording, expected, loopback):
    """SIGKILL to a worker once the first blocks arrive: Dask runs its
    tasks (and the results it held) again elsewhere; the rows are the same."""
    address, workers = loopback
    victim = workers[0]
    killed = []

    def decode(on):
        def on_blocks(b):
            if not killed:
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                killed.append(time.monotonic())
            on(b)

        return decode_distributed(str(recording), on_blocks, cluster=address, **SMALL)

    got = collect(decode)
    assert killed
    same(got, expected)


# --------------------------------------------------------------------------
# Raw Intel PT (ptxed's input) through perf.data: hwtrace.perf.wrap


@pytest.fixture(scope="module")
def raw_trace(tmp_path_factory):
    """A compiled function's emulated path, run 60 times over, as raw PT
    with TSC, MTC and a PSB every 512 bytes (about 10 KiB); its ELF."""
    import groundtruth as gt

    from hwtrace.image import Image
    from hwtrace.pt.encode import encode_path

    if gt.skip_reason is not None:
        pytest.skip(str(gt.skip_reason))
    run = gt.case("mixed", "-O2")
    image = Image()
    image.add_elf(run.elf, run.load_address)
    enc = encode_path(np.tile(run.ips, 60), image, end_ip=run.end_ip, tsc=1 << 40, mtc_freq=3,
                      ctc_ratio=100, cbr=24, psb_period=512)  # fmt: skip
    d = tmp_path_factory.mktemp("raw")
    (d / "trace.pt").write_bytes(enc.data)
    return d / "trace.pt", run.elf, image, enc


def test_raw_trace_wrapped_decodes_as_the_trace(raw_trace, tmp_path, capsys):
    """``decode --pt --elf``: the rows are decode_trace's blocks and
    instructions; the wrapped perf.data (records cut at PSBs) decoded by
    Dask tasks gives stream_perf's rows; bad input is one line."""
    import pyarrow.dataset as ds

    from hwtrace.perf.wrap import wrap_raw_trace
    from hwtrace.pt.decode import decode_trace
    from hwtrace.pt.packets import sync_forward

    pt, elf, image, enc = raw_trace
    cfg = enc.config
    want = decode_trace(enc.data, image, cfg)
    assert want.n_insn == len(enc.expected) and not want.gaps
    out, kept = tmp_path / "flow", tmp_path / "kept.data"
    args = ["decode", "--pt", str(pt), "--elf", str(elf), "-o", str(out), "--instructions",
            "--no-progress", "--perf-data", str(kept), "--mtc-freq", str(cfg.mtc_freq),
            "--nom-freq", str(cfg.nom_freq), "--cpuid-0x15.eax", str(cfg.cpuid_0x15_eax),
            "--cpuid-0x15.ebx", str(cfg.cpuid_0x15_ebx)]  # fmt: skip
    assert hwtrace_main(args) == 0
    blocks = ds.dataset(out / "blocks", partitioning="hive").to_table().sort_by("row")
    np.testing.assert_array_equal(blocks["ip"].to_numpy(), want.block_ip)
    np.testing.assert_array_equal(blocks["instructions"].to_numpy(), want.block_ninsn)
    assert blocks["time"].null_count == 0 and set(blocks["tid"].to_pylist()) == {1}
    insns = ds.dataset(out / "instructions", partitioning="hive").to_table()
    insns = insns.sort_by([("row", "ascending"), ("k", "ascending")])
    np.testing.assert_array_equal(insns["ip"].to_numpy(), enc.expected)
    # Without --perf-data the wrapped file is gone afterwards.
    assert hwtrace_main([*args[:5], "-o", str(tmp_path / "f2"), "--no-progress"]) == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".perf.data")] == []

    # Small AUXTRACE records, each after the first starting at a PSB.
    small = tmp_path / "small.data"
    info = wrap_raw_trace(pt, small, elf=[(elf, None)], config=cfg, record_bytes=4096)
    assert info["timed"] and info["records"] >= 3
    data = read_perf_data(small)
    aux = data.auxtrace_columns()
    assert len(aux["size"]) == info["records"]
    for k, at in enumerate(aux["data_offset"].tolist()):
        assert k == 0 or sync_forward(data.buf[at : at + 16]) == 0
    expected = collect(lambda on: stream_perf(read_perf_data(small), on))
    assert expected[0][0]["ninsn"].sum() == len(enc.expected)
    same(collect(lambda on: decode_distributed(str(small), on, task_bytes=1024,
                                               chunk_bytes=1024)), expected)  # fmt: skip

    capsys.readouterr()
    bad = hwtrace_main(["decode", "--pt", str(pt), "--elf", str(tmp_path / "nope"), "-o",
                        str(tmp_path / "f3")])  # fmt: skip
    err = capsys.readouterr().err
    assert bad == 1 and err.count("\n") == 1 and "nope" in err and "Traceback" not in err


# --------------------------------------------------------------------------
# Parquet written by the workers: the same dataset as one process writes


def _dataset(flow: Path) -> dict[str, object]:
    """Every table of a flow directory, rows in a fixed order (by queue and
    row; the names by id), and the row counts of ``_meta.json``."""
    import json

    import pyarrow.dataset as ds

    out: dict[str, object] = {}
    for name in ("blocks", "events", "gaps", "symbols", "images", "comms", "instructions"):
        if not (flow / name).exists():
            continue
        t = ds.dataset(flow / name, format="parquet", partitioning="hive").to_table()
        out[name] = t.sort_by([(c, "ascending") for c in t.column_names])
    meta = json.loads((flow / "_meta.json").read_text())
    out["meta"] = (meta["rows"], meta["queues"], meta["n_gaps"], meta["instructions_decoded"],
                   meta["problems"])  # fmt: skip
    hidden = [p for p in flow.rglob(".*")]
    assert not hidden, hidden
    return out


def same_dataset(got: Path, want: Path) -> None:
    a, b = _dataset(got), _dataset(want)
    assert sorted(a) == sorted(b)
    assert b["blocks"].num_rows > 0
    for name in b:
        if name == "meta":
            assert a[name] == b[name]
        else:
            assert a[name].schema.equals(b[name].schema), name
            assert a[name].equals(b[name]), name


def _single(recording: Path, out: Path, *extra: str) -> Path:
    assert hwtrace_main(["decode", str(recording), "-o", str(out), "--no-progress", "--bucket",
                         "0.01", *extra]) == 0  # fmt: skip
    return out


@pytest.fixture(scope="module")
def single_flow(recording, tmp_path_factory) -> Path:
    return _single(recording, tmp_path_factory.mktemp("single") / "flow", "--instructions")


def _to_parquet(recording: Path, out: Path, on_piece=None, **kw) -> Path:
    """decode_to_parquet into ``out`` as ``hwtrace decode`` calls it."""
    from hwtrace.cli.decode import _metadata, _parser
    from hwtrace.cli.perfinput import open_session
    from hwtrace.cluster import decode_to_parquet
    from hwtrace.export.parquet import FlowParquetWriter, Names, build_ids_of

    a = _parser().parse_args([str(recording), "-o", str(out), "--instructions"])
    a.input = a.source
    opened = open_session("test", a)
    writer = FlowParquetWriter(out, _metadata(a, [], opened), bucket_ns=10_000_000,
                               names=Names(build_ids=build_ids_of(opened.sideband)),
                               instructions=True)  # fmt: skip
    flow, tids = decode_to_parquet(str(recording), writer, on_piece=on_piece, **kw)
    for q in flow.queues:
        writer.write_gaps(q, q.gaps)
    sb = flow.sideband
    writer.write_comms({t: (sb.pid_of(t), sb.comm_of(t)) for t in tids})
    writer.close({"queues": [{"index": q.index, "cpu": q.cpu, "tid": q.tid,
                              "trace_bytes": q.trace_bytes, "blocks": q.n_blocks,
                              "instructions": q.n_insn, "gaps": len(q.gaps)}
                             for q in flow.queues],
                  "problems": list(flow.problems), "n_gaps": flow.n_gaps,
                  "instructions_decoded": writer.n_insn})  # fmt: skip
    return out


def test_parquet_pieces_in_process(recording, single_flow, tmp_path):
    """Many pieces, written one by one here: the single process's dataset."""
    seen = []
    out = _to_parquet(recording, tmp_path / "flow", on_piece=lambda b, n: seen.append(n), **SMALL)
    assert len(seen) >= 20 and sum(seen) > 0
    same_dataset(out, single_flow)
    parts = list((out / "blocks").rglob("q*-p*-*.parquet"))
    assert len({p.name.split("-")[1] for p in parts}) >= 10  # written piece by piece


def test_parquet_corrupt_chunks(recording, tmp_path):
    """Gaps inside and between pieces: the same dataset."""
    bad = tmp_path / "bad.data"
    raw = bytearray(recording.read_bytes())
    data = read_perf_data(recording)
    aux = data.auxtrace_columns()
    start = int(aux["data_offset"][np.argmax(aux["size"])])
    for at in (start + 4090, start + 12000, start + 20000):
        raw[at : at + 64] = bytes([0xD9]) * 64
    bad.write_bytes(bytes(raw))
    want = _single(bad, tmp_path / "single", "--instructions")
    same_dataset(_to_parquet(bad, tmp_path / "flow", **SMALL), want)


def test_parquet_cli_workers(recording, single_flow, tmp_path):
    """``hwtrace decode --workers 2``: the workers write; the same dataset."""
    out = _single(recording, tmp_path / "flow", "--instructions", "--workers", "2")
    same_dataset(out, single_flow)


def test_parquet_loopback_worker_killed(recording, single_flow, loopback, tmp_path):
    """A worker killed once the first piece is written: Dask decodes and
    writes its pieces again elsewhere; the same dataset, no half files."""
    from distributed import Client

    address, workers = loopback
    # Two live workers (an earlier test killed one): start what is missing.
    cmd = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
           "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"]  # fmt: skip
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": tmp_path}
    while sum(w.poll() is None for w in workers) < 2:
        workers.append(subprocess.Popen(cmd, **quiet))
    with Client(address, timeout=30) as c:
        c.wait_for_workers(2, timeout=60)
    victim = next(w for w in workers if w.poll() is None)
    killed = []

    def on_piece(nbytes, rows):
        if not killed:
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            killed.append(rows)

    out = _to_parquet(recording, tmp_path / "flow", on_piece=on_piece, cluster=address, **SMALL)
    assert killed
    same_dataset(out, single_flow)


def test_parquet_dense_trace_pieces(raw_trace, tmp_path):
    """A dense trace (compiled code, a PSB every 512 bytes) cut into 1 KiB
    pieces, every piece with blocks: each piece's last block lasts until
    the next piece's first; the single process's dataset."""
    from hwtrace.perf.wrap import wrap_raw_trace

    pt, elf, _, enc = raw_trace
    data = tmp_path / "dense.data"
    wrap_raw_trace(pt, data, elf=[(elf, None)], config=enc.config, record_bytes=4096)
    want = _single(data, tmp_path / "single", "--instructions")
    seen = []
    got = _to_parquet(data, tmp_path / "flow", on_piece=lambda b, n: seen.append(n),
                      task_bytes=1024, chunk_bytes=1024)  # fmt: skip
    assert len(seen) >= 8 and min(seen) > 0
    same_dataset(got, want)


def test_parquet_ptwrites_across_pieces(tmp_path):
    """A loop around a PTWRITE, 3,000 times, with a PSB every 512 bytes, cut
    into 1 KiB pieces: every payload stays with the block it follows, also
    where that block is a piece's last and the payload comes in the next
    piece's bytes; the single process's events and blocks."""
    from hwtrace.image import Image
    from hwtrace.image.sections import Section
    from hwtrace.perf.wrap import wrap_raw_trace
    from hwtrace.pt.encode import encode_path

    # loop: ptwrite rax; add rax, 1; cmp rax, 5; jne loop; nop
    code = bytes.fromhex("f3480faee04883c0014883f80575f190")
    base = 0x400000
    image = Image()
    image.add_section(Section.from_bytes(code, base))
    n = 3000
    ips = np.tile(np.array([base, base + 5, base + 9, base + 13], np.uint64), n)
    ips = np.append(ips, np.uint64(base + 15))
    ptws = [(4 * k, 0x5100 + k, 8) for k in range(n)]
    enc = encode_path(ips, image, tsc=1 << 40, mtc_freq=3, ctc_ratio=100, cbr=24,
                      psb_period=512, ptwrites=ptws)  # fmt: skip
    (tmp_path / "t.pt").write_bytes(enc.data)
    (tmp_path / "code.bin").write_bytes(code)
    data = tmp_path / "ptw.data"
    wrap_raw_trace(tmp_path / "t.pt", data, raw=[(tmp_path / "code.bin", 0, None, base)],
                   config=enc.config, record_bytes=4096)  # fmt: skip
    want = _single(data, tmp_path / "single", "--instructions")
    seen = []
    got = _to_parquet(data, tmp_path / "flow", on_piece=lambda b, n: seen.append(n),
                      task_bytes=1024, chunk_bytes=1024)  # fmt: skip
    events = _dataset(want)["events"]
    assert len(seen) >= 20 and events.num_rows == n
    assert sorted(events["payload"].to_pylist()) == [0x5100 + k for k in range(n)]
    same_dataset(got, want)


def test_parquet_ptwrites(ptw_recording, tmp_path):  # noqa: F811 (the fixture)
    """PTWRITE payloads (events) written by the write tasks: the single
    process's rows.  (This recording has one PSB, so one piece: payloads
    crossing pieces are not covered here.)"""
    want = _single(ptw_recording, tmp_path / "single", "--instructions")
    got = _to_parquet(ptw_recording, tmp_path / "flow", task_bytes=1024, chunk_bytes=1024)
    assert _dataset(want)["events"].num_rows > 0
    same_dataset(got, want)


def test_without_distributed_is_one_line(recording, monkeypatch):
    """Dask's distributed is an extra (hwtrace[cluster]): without it,
    decoding with workers says what to install."""
    monkeypatch.setitem(sys.modules, "distributed", None)  # (an import of it fails)
    with pytest.raises(DistributedError) as e:
        decode_distributed(str(recording), lambda b: None, workers=2, **SMALL)
    msg = str(e.value)
    assert "\n" not in msg and "hwtrace[cluster]" in msg
