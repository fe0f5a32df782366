"""``hwtrace decode`` writes a recording's decoded flow as Parquet datasets;
``hwtrace query`` runs SQL over them; ``hwtrace report -i DIR`` reads them.

A real program (four threads, a recursive function) is recorded with
``hwtrace record``'s software backend, decoded into a directory, and the
rows are checked against the decoder's own batches (``stream_perf``),
column by column; the instruction rows against the decoder's instruction
sequence; the ready views against ``hwtrace report``'s profiler; the time
partitions against what a filtered read opens.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_record_software import SKIP, compile_program
from test_record_threads import PROGRAM

from hwtrace.analysis.profile import ThreadProfiler
from hwtrace.export.parquet import Names, blocks_table
from hwtrace.perf.data import read_perf_data
from hwtrace.session.perfflow import stream_perf

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]
FUNCTIONS = ("work_a", "work_b", "work_c", "fold", "work_d")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HWTRACE, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    exe = compile_program(PROGRAM, "threads", ("-O1", "-g", "-pthread"))
    d = tmp_path_factory.mktemp("flow")
    data = d / "threads.data"
    fs = [x for f in FUNCTIONS for x in ("-f", f)]
    out = run("record", "--backend", "step", "-o", str(data), *fs, "--", str(exe), "four")
    assert out.returncode == 0, out.stderr
    # A decode with instructions and 50 ms time buckets (several partitions).
    flow = d / "flow"
    out = run("decode", str(data), "-o", str(flow), "--instructions", "--bucket", "0.05")
    assert out.returncode == 0, out.stderr
    assert "blocks" in out.stderr and "MB/s" in out.stderr
    return data, flow


@pytest.fixture(scope="module")
def batches(recorded):
    """What the decoder hands ``hwtrace report``: every batch, kept."""
    data, _ = recorded
    got = []
    stream = stream_perf(read_perf_data(str(data)), got.append)
    return got, stream


def _read(flow: Path, name: str) -> pa.Table:
    t = ds.dataset(flow / name, format="parquet", partitioning="hive").to_table()
    keys = [("queue", "ascending"), ("row", "ascending")]
    if name == "instructions":
        keys.append(("k", "ascending"))
    return t.sort_by(keys)


def test_block_rows_are_the_decoders_batches(recorded, batches):
    _, flow = recorded
    got, stream = batches
    assert len(stream.queues) == 4 and len(got) >= 4
    t = _read(flow, "blocks")
    n = sum(len(b) for b in got)
    assert t.num_rows == n
    cat = {
        "queue": np.concatenate([np.full(len(b), b.queue.index) for b in got]),
        "cpu": np.concatenate([np.full(len(b), b.queue.cpu) for b in got]),
        "tid": np.concatenate([b.tid for b in got]),
        "pid": np.concatenate([b.pid for b in got]),
        "time": np.concatenate([b.ns for b in got]),
        "duration": np.concatenate([b.duration for b in got]),
        "ip": np.concatenate([b.ip for b in got]),
        "instructions": np.concatenate([b.ninsn for b in got]),
        "mode": np.concatenate([b.mode for b in got]),
        "space": np.concatenate([b.image for b in got]),
        "row": np.concatenate([b.row + np.arange(len(b)) for b in got]),
        "gap": np.concatenate([b.gap for b in got]),
        "trace_offset": np.concatenate([b.offset for b in got]),
    }
    for col, want in cat.items():
        have = t.column(col).to_numpy(zero_copy_only=False)
        if col == "time":
            have = t.column(col).fill_null(-1).to_numpy()
        np.testing.assert_array_equal(have, want.astype(have.dtype), err_msg=col)
    assert (cat["time"] >= 0).all() and cat["duration"].sum() > 0
    # Each block's trace offset is a packet of its queue's trace (or its
    # end, for blocks the last packets complete), rising.
    from hwtrace.perf.intelpt import iter_queue_traces
    from hwtrace.pt.packets import decode_range

    data = read_perf_data(str(recorded[0]))
    for qi, (_, _, trace) in enumerate(iter_queue_traces(data)):
        mine = t.filter(pa.compute.equal(t["queue"], qi))["trace_offset"].to_numpy()
        packets = np.append(decode_range(trace, 0, trace.shape[0]).offset, trace.shape[0])
        assert mine.shape[0] and np.isin(mine, packets).all(), qi
        assert (np.diff(mine) >= 0).all(), qi
    # Symbols: the id of each row names the function report looks up.
    want_fn = []
    for b in got:
        for space, sel in b.images():
            table = b.queue.symbols(space)
            index, _ = table.lookup(b.ip[sel])
            want_fn += [table.qualified_name(i) if i >= 0 else None for i in index.tolist()]
    symbols = ds.dataset(flow / "symbols").to_table()
    fn = dict(zip(symbols["id"].to_pylist(), symbols["function"].to_pylist(), strict=True))
    have_fn = [fn[s] if s is not None else None for s in t["symbol"].to_pylist()]
    assert have_fn == want_fn
    assert {f.split("!")[-1] for f in fn.values()} == set(FUNCTIONS)
    images = ds.dataset(flow / "images").to_table()
    assert set(symbols["image"].to_pylist()) <= set(images["id"].to_pylist())
    assert any("/threads-" in p for p in images["path"].to_pylist())


def test_instruction_rows_are_the_decoders_instructions(recorded, batches):
    _, flow = recorded
    got, _ = batches
    t = _read(flow, "instructions")
    want = np.concatenate([b.instructions() for b in got])
    np.testing.assert_array_equal(t["ip"].to_numpy(), want)
    per_block = np.concatenate([b.ninsn for b in got])
    assert t.num_rows == int(per_block.sum())
    blocks = _read(flow, "blocks")
    # Each block's first instruction is its ip.
    first = t.filter(pa.compute.equal(t["k"], 0))
    np.testing.assert_array_equal(first["ip"].to_numpy(), blocks["ip"].to_numpy())


def test_blocks_table_is_pure_and_names_merge(batches):
    got, _ = batches
    one = Names()
    tables = [blocks_table(b, one) for b in got]
    # The same batch gives the same rows, whatever a Names met before.
    halves = [Names(), Names()]
    again = [blocks_table(b, halves[i % 2]) for i, b in enumerate(reversed(got))][::-1]
    for x, y in zip(tables, again, strict=True):
        assert x.equals(y)
    merged = Names()
    for h in halves:
        merged.merge(h)
    assert merged.symbols_table().equals(one.symbols_table())
    assert merged.images_table().equals(one.images_table())


def test_views_count_as_report_does(recorded, batches):
    from hwtrace.export.query import connect

    _, flow = recorded
    got, stream = batches
    profiler = ThreadProfiler()
    for b in got:
        rows = b.row + np.arange(len(b))
        for image, sel in b.images():
            profiler.add(b.queue.index, image, b.queue.symbols(image), ip=b.ip[sel],
                         ninsn=b.ninsn[sel], ns=b.ns[sel], duration=b.duration[sel],
                         tid=b.tid[sel], pid=b.pid[sel], row=rows[sel])  # fmt: skip
    profile = profiler.result(stream.sideband.comm_of)
    want: dict[tuple[int, str], tuple[int, int]] = {}
    totals: dict[str, list[int]] = {}
    for th in profile.threads:
        for k in np.flatnonzero(th.by_insn).tolist():
            name = th.names[k - 1] if k else "[unknown]"
            want[(th.tid, name)] = (int(th.by_insn[k]), int(th.by_time[k]))
            acc = totals.setdefault(name, [0, 0])
            acc[0] += int(th.by_insn[k])
            acc[1] += int(th.by_time[k])
    con, _ = connect(flow)
    have = {(tid, f): (i, t) for tid, f, i, t in con.execute(
        "SELECT tid, function, instructions, time_ns FROM thread_functions").fetchall()}  # fmt: skip
    assert have == want
    have = {f: [i, t] for f, i, t in con.execute(
        "SELECT function, instructions, time_ns FROM functions").fetchall()}  # fmt: skip
    assert have == totals and len(totals) == len(FUNCTIONS)
    threads = con.execute("SELECT tid, pid, comm, instructions, span_ns FROM threads "
                          "ORDER BY tid").fetchall()  # fmt: skip
    assert threads == [(th.tid, th.pid, th.comm, th.instructions, th.span_ns)
                       for th in profile.threads]  # fmt: skip
    # fold recurses 6 deep per call of work_c's loop: many entries; the
    # other functions are entered once per thread.
    calls = dict(
        con.execute("SELECT split_part(function, '!', 2), entries FROM entries").fetchall()
    )
    assert calls["work_a"] == calls["work_b"] == calls["work_d"] == 1
    assert calls["fold"] > 100
    assert con.execute("SELECT count(*) FROM gap_summary").fetchone()[0] == 0


def test_report_of_the_directory_is_the_report_of_the_recording(recorded):
    data, flow = recorded
    direct = run("report", "-i", str(data))
    again = run("report", "-i", str(flow))
    assert direct.returncode == 0 and again.returncode == 0, again.stderr
    assert again.stdout == direct.stdout
    assert "fold" in again.stdout and "4 trace queue(s)" in again.stdout
    bad = run("report", "-i", str(flow), "--folded", "x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_filters_on_partitions_read_only_their_files(recorded):
    from hwtrace.export.query import connect

    _, flow = recorded
    buckets = sorted(int(p.name.split("=")[1]) for p in (flow / "blocks" / "cpu=-1").iterdir())
    assert len(buckets) > 2
    b = buckets[len(buckets) // 2]
    files = len(list((flow / "blocks").rglob("*.parquet")))
    mine = len(list((flow / "blocks" / "cpu=-1" / f"bucket={b}").glob("*.parquet")))
    dataset = ds.dataset(flow / "blocks", format="parquet", partitioning="hive")
    picked = list(dataset.get_fragments(filter=ds.field("bucket") == b))
    assert len(picked) == mine < files and all(f"bucket={b}/" in f.path for f in picked)
    con, _ = connect(flow)
    plan = "\n".join(r[1] for r in con.execute(
        f"EXPLAIN SELECT count(*) FROM blocks WHERE bucket = {b}").fetchall())  # fmt: skip
    m = re.search(r"Scanning Files: (\d+)/(\d+)", plan)
    assert m is not None, plan
    assert (int(m.group(1)), int(m.group(2))) == (mine, files)
    n, lo, hi = con.execute(f"SELECT count(*), min(time), max(time) FROM blocks "
                            f"WHERE bucket = {b}").fetchone()  # fmt: skip
    assert n > 0 and lo // 50_000_000 == b == hi // 50_000_000
    assert con.execute("SELECT count(*) FROM blocks WHERE cpu = 7").fetchone()[0] == 0


def test_bad_input_and_bad_sql_are_one_line(recorded, tmp_path):
    data, flow = recorded
    out = run("decode", str(tmp_path / "missing.data"), "-o", str(tmp_path / "o1"))
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "missing.data" in out.stderr and "Traceback" not in out.stderr
    junk = tmp_path / "junk.data"
    junk.write_bytes(b"PERFILE2" + bytes(range(256)) * 4)
    out = run("decode", str(junk), "-o", str(tmp_path / "o2"))
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "junk.data" in out.stderr and "Traceback" not in out.stderr
    out = run("decode", str(junk), "-o", str(flow))
    assert out.returncode == 1 and "not an empty directory" in out.stderr
    for bucket in ("0", "nan", "1e300"):
        out = run("decode", str(data), "-o", str(tmp_path / "o3"), "--bucket", bucket)
        assert out.returncode == 2 and "--bucket" in out.stderr and "Traceback" not in out.stderr
    out = run("query", str(flow), "SELEC count(*) FROM blocks")
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "syntax error" in out.stderr and "Traceback" not in out.stderr
    out = run("query", str(flow), "SELECT nope FROM blocks")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "nope" in out.stderr
    assert "(line 1, column 8)" in out.stderr  # DuckDB's caret, as a place
    # A table or view only some decodes write: the option that writes it;
    # a name not there: the directory's nearest, not DuckDB's own catalog's.
    out = run("query", str(flow), "SELECT *\n FROM calls")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "calls: not in" in out.stderr and "(line 2, column 7)" in out.stderr
    assert "hwtrace decode --function-calls" in out.stderr
    out = run("query", str(flow), "SELECT * FROM symbol")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "did you mean symbols?" in out.stderr and "pg_" not in out.stderr
    out = run("query", str(tmp_path), "SELECT 1")
    assert out.returncode == 1 and "_meta.json" in out.stderr and out.stderr.count("\n") == 1
    out = run("query", str(data), "SELECT 1")  # (the recording, not its decode)
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "not an hwtrace decode directory" in out.stderr and "Errno" not in out.stderr


def test_query_examples_of_the_docs_run(recorded):
    """Every ``hwtrace query`` example of the README and the guides runs
    on a decode directory (one named a column the view does not have)."""
    _, flow = recorded
    root = Path(__file__).resolve().parents[2]
    sqls = []
    for doc in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        sqls += re.findall(r'hwtrace query \S+ "([^"]+)"', doc.read_text())
    assert len(sqls) >= 3
    for sql in sqls:
        out = run("query", str(flow), sql)
        assert out.returncode == 0, (sql, out.stderr)


def test_query_prints_tables_csv_and_json(recorded):
    _, flow = recorded
    out = run("query", str(flow), "SELECT function, instructions FROM functions "
              "ORDER BY instructions DESC", "--csv")  # fmt: skip
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0] == "function,instructions" and len(lines) == 6
    out = run("query", str(flow), "SELECT tid, comm FROM threads", "--json")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 4
    out = run("query", str(flow), "--views")
    assert all(v in out.stdout for v in ("functions", "threads", "calls", "gap_summary"))


def _codecs(directory: Path) -> set[str]:
    """The codecs of the column chunks of a dataset's files (but the tiny
    chunks, which are stored as they are)."""
    import pyarrow.parquet as pq

    found = set()
    for f in directory.rglob("*.parquet"):
        meta = pq.read_metadata(f)
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            found |= {rg.column(c).compression for c in range(rg.num_columns)}
    return found - {"UNCOMPRESSED"}


def test_compression_is_the_users_choice(recorded, tmp_path):
    """``--compression lz4`` writes the same rows as the default zstd, with
    LZ4 (Parquet's LZ4_RAW) pages; an unknown codec is refused by name."""
    data, flow = recorded
    out = run("decode", str(data), "-o", str(tmp_path / "lz4"), "--instructions", "--bucket",
              "0.05", "--compression", "lz4")  # fmt: skip
    assert out.returncode == 0, out.stderr
    for name in ("blocks", "instructions"):
        assert _read(tmp_path / "lz4", name).equals(_read(flow, name)), name
        assert _codecs(tmp_path / "lz4" / name) == {"LZ4"}
        assert _codecs(flow / name) == {"ZSTD"}
    out = run("decode", str(data), "-o", str(tmp_path / "x"), "--compression", "gzip")
    assert out.returncode == 2 and "invalid choice: 'gzip'" in out.stderr


def test_distributed_decode_or_one_line(recorded, tmp_path):
    data, flow = recorded
    out = run("decode", str(data), "-o", str(tmp_path / "d"), "--workers", "2",
              "--compression", "snappy")  # fmt: skip
    if importlib.util.find_spec("hwtrace.cluster") is None:
        assert out.returncode == 1 and out.stderr.count("\n") == 1
        assert "hwtrace.cluster is not available" in out.stderr
        return
    assert out.returncode == 0, out.stderr
    mine, theirs = _read(flow, "blocks"), _read(tmp_path / "d", "blocks")
    assert theirs.drop_columns(["bucket"]).equals(mine.drop_columns(["bucket"]))
    assert _codecs(tmp_path / "d" / "blocks") == {"SNAPPY"}


def test_drain_writes_every_block_given(batches, tmp_path):
    """What ``hwtrace decode`` times: after ``drain`` no row waits for a
    row group's worth and no write is queued; more may be written after."""
    from hwtrace.export.parquet import FlowParquetWriter, finish_dataset

    got, stream = batches
    w = FlowParquetWriter(tmp_path / "flow", {}, names=Names(), background=True)
    half = len(got) // 2
    for b in got[:half]:
        w.write_blocks(b)
    w.drain()
    assert not w.blocks.waiting and not w.io.pending
    for b in got[half:]:
        w.write_blocks(b)
    meta = finish_dataset(w, stream, set())
    assert meta["rows"]["blocks"] == sum(len(b) for b in got)
    assert _read(tmp_path / "flow", "blocks").num_rows == meta["rows"]["blocks"]


def test_writes_queue_by_the_memory_they_hold():
    """A background write that says what it holds waits beside others up
    to ``most`` while they fit the budget; one that does not say, or does
    not fit, waits for all but ``depth`` before it; every write runs, in
    order."""
    import threading

    from hwtrace.export.parquet import _Io

    io = _Io(True, depth=2, most=4, budget=100)
    gate = threading.Event()
    ran: list[int] = []

    def write(k: int) -> None:
        gate.wait()
        ran.append(k)

    try:
        for k in range(4):
            io.submit(10, write, k)  # (none done yet: none may be waited for)
        assert len(io.pending) == 4 and io.weight == 40
        gate.set()
        io.submit(10, write, 4)  # (at most 4 queued)
        assert len(io.pending) <= 4
        io.submit(90, write, 5)  # (over the budget: queued behind at most depth - 1)
        assert len(io.pending) <= 2
        io.run(write, 6)
        assert len(io.pending) <= 2
        io.wait()
        assert ran == list(range(7)) and not io.pending and io.weight == 0
    finally:
        gate.set()
        io.stop()


def test_sql_errors_name_line_and_column_of_the_query():
    """DuckDB points at the place with an excerpt and a caret, the excerpt
    cut ('...') around it on a long line: one line names line and column."""
    import duckdb

    from hwtrace.cli.query import sql_error_line

    long = "SELECT " + " + ".join(["1"] * 60) + " + nosuchcol"
    for sql, line, column in (
        ("SELECT 1,\n  2 FRM x", 2, 9),  # ("2 FRM" is "2 AS FRM": the x is wrong)
        (long, 1, long.index("nosuchcol") + 1),
    ):
        with pytest.raises(duckdb.Error) as e:
            duckdb.connect().execute(sql)
        got = sql_error_line(str(e.value), sql)
        assert "\n" not in got and f"(line {line}, column {column})" in got, got


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 80),
    shape=st.sampled_from(["rising", "unknown first", "any", "unknown"]),
    as_runs=st.booleans(),
)
def test_a_batchs_time_buckets_are_its_rows_buckets_in_runs(seed, n, shape, as_runs):
    """A batch's time buckets, told as one bucket or as runs (found among
    the time's runs, or by searching rising times, buckets they jump over
    left out), are each row's ``ns // bucket`` (-1 where its time is not
    known)."""
    from hwtrace.columns import Runs
    from hwtrace.export.parquet import FlowParquetWriter

    rng = np.random.default_rng(seed)
    ns = np.sort(rng.integers(0, 9000, n))
    if shape == "unknown first":
        ns[: rng.integers(0, n + 1)] = -1
    elif shape == "any":
        ns = np.where(rng.random(n) < 0.2, -1, rng.integers(0, 9000, n))
    elif shape == "unknown":
        ns[:] = -1
    writer = FlowParquetWriter.__new__(FlowParquetWriter)
    writer.bucket_ns = 1000
    col = Runs.of(ns, 1) if as_runs else ns
    got = writer._bucket(col)
    if isinstance(got, tuple):
        starts, buckets = got
        assert starts[0] == 0 and (np.diff(starts) > 0).all() and (np.diff(buckets) != 0).all()
        got = np.repeat(buckets, np.diff(np.append(starts, n)))
    assert (np.broadcast_to(got, (n,)) == np.where(ns >= 0, ns // 1000, -1)).all()
