"""The compiled Parquet writer against two readers nobody here wrote:
Arrow's (pyarrow) and DuckDB's.  Random columns of every type it stores,
with nulls, split into random pieces and row groups, read back equal, with
the statistics Arrow computes for the same values."""

import itertools
import time
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.columns import SequencedKeys
from hwtrace.export import _parquet_pages as pp
from hwtrace.export.parquet_file import (
    COMPRESSIONS,
    WRITES_AHEAD,
    ParquetFileWriter,
    column_specs,
)


@pytest.fixture(autouse=True, scope="module")
def _scratch_not_zeroed():
    """The writers' scratch buffers are not zeroed (numpy.empty: a process
    that writes again gets its freed memory back): filled with a pattern
    here whenever they are made, so that an encoder reading a byte it did
    not write makes other pages than the reference encoders and Arrow
    read back."""
    from hwtrace.export import parquet_file

    grow = parquet_file._Scratch.grow

    def grow_poisoned(self, rows: int) -> None:
        before = self.rows
        grow(self, rows)
        if self.rows != before:
            for a in (self.levels, self.indices, self.index_raw, self.wide, self.out):
                a.view(np.uint8).fill(0xA5)

    parquet_file._Scratch.grow = grow_poisoned
    yield
    parquet_file._Scratch.grow = grow


TYPES = {"i32": pa.int32(), "i64": pa.int64(), "u8": pa.uint8(), "u64": pa.uint64(),
         "b": pa.bool_()}  # fmt: skip
NP = {"i32": np.int32, "i64": np.int64, "u8": np.uint8, "u64": np.uint64, "b": np.bool_}


def _values(kind: str, n: int, style: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "b":
        return rng.random(n) < (0.5 if style == "random" else 0.02)
    info = np.iinfo(NP[kind])
    if style == "few":
        pool = rng.integers(info.min, info.max, 5, dtype=NP[kind], endpoint=True)
        return pool[rng.integers(0, 5, n)]
    if style == "rising" and kind in ("i64", "u64"):
        return np.cumsum(rng.integers(0, 1 << 20, n)).astype(NP[kind])
    if style == "zeros":
        return np.zeros(n, NP[kind])
    if style == "runs":
        return np.repeat(rng.integers(0, 3, n // 7 + 1), 7)[:n].astype(NP[kind])
    return rng.integers(info.min, info.max, n, dtype=NP[kind], endpoint=True)


def _expected(kind: str, values: np.ndarray, null: int) -> pa.Array:
    if kind in ("u64", "u8", "b") or null == pp.NOT_NULL:
        return pa.array(values, TYPES[kind])
    mask = values < 0 if null == pp.NULL_IF_NEGATIVE else values == 0
    return pa.array(values, TYPES[kind], mask=mask)


def _write(path, columns, pieces_at, groups_at, encoding, nulls, compression="zstd", ahead=False):
    schema = pa.schema([(name, TYPES[kind]) for name, (kind, _) in columns.items()])
    specs = column_specs(schema, encoding, nulls)
    w = ParquetFileWriter(path, schema, specs, {b"hwtrace": b'{"x": 1}'}, compression,
                          ahead=ahead)  # fmt: skip
    n = len(next(iter(columns.values()))[1])
    cuts = sorted({0, n, *pieces_at})
    pieces = [({k: v[lo:hi] for k, (_, v) in columns.items()}, hi - lo)
              for lo, hi in itertools.pairwise(cuts)]  # fmt: skip
    group_cuts = sorted({0, len(pieces), *(g % (len(pieces) + 1) for g in groups_at)})
    for lo, hi in itertools.pairwise(group_cuts):
        w.write_row_group(pieces[lo:hi])
    w.close()
    return schema


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 3000),
    seed=st.integers(0, 2**32 - 1),
    kinds=st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=5),
    styles=st.lists(
        st.sampled_from(["random", "few", "rising", "runs", "zeros"]), min_size=5, max_size=5
    ),
    encodings=st.lists(st.sampled_from(["dictionary", "delta", "plain"]), min_size=5, max_size=5),
    null_rules=st.lists(
        st.sampled_from([pp.NOT_NULL, pp.NULL_IF_NEGATIVE, pp.NULL_IF_ZERO]), min_size=5, max_size=5
    ),
    pieces_at=st.lists(st.integers(0, 3000), max_size=6),
    groups_at=st.lists(st.integers(0, 8), max_size=3),
    compression=st.sampled_from(sorted(COMPRESSIONS)),
    ahead=st.booleans(),
)
def test_arrow_and_duckdb_read_back_what_was_written(
    tmp_path_factory, n, seed, kinds, styles, encodings, null_rules, pieces_at, groups_at,
    compression, ahead,
):  # fmt: skip
    import duckdb

    rng = np.random.default_rng(seed)
    columns = {f"c{i}_{k}": (k, _values(k, n, styles[i], rng)) for i, k in enumerate(kinds)}
    encoding: dict[str, list[str]] = {"dictionary": [], "delta": []}
    nulls = {}
    for i, name in enumerate(columns):
        if encodings[i] != "plain":
            encoding[encodings[i]].append(name)
        nulls[name] = null_rules[i] if columns[name][0] in ("i32", "i64") else pp.NOT_NULL
    path = tmp_path_factory.mktemp("pq") / "t.parquet"
    schema = _write(path, columns, [p % (n + 1) for p in pieces_at], groups_at, encoding, nulls,
                    compression, ahead)  # fmt: skip
    specs = {s.name: s for s in column_specs(schema, encoding, nulls)}
    table = pq.read_table(path)
    assert table.schema.remove_metadata() == schema
    assert pq.read_metadata(path).metadata[b"hwtrace"] == b'{"x": 1}'
    for name, (kind, values) in columns.items():
        want = _expected(kind, values, specs[name].null)
        got = table.column(name).combine_chunks()
        assert got.equals(want), name
    # Statistics: what Arrow computes for each row group's values.
    meta = pq.read_metadata(path)
    at = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            kind, values = columns[col.path_in_schema]
            want = _expected(kind, values[at : at + rg.num_rows], specs[col.path_in_schema].null)
            stats = col.statistics
            assert stats.null_count == want.null_count
            if want.null_count < len(want):
                mm = pc.min_max(want)
                assert (stats.min, stats.max) == (mm["min"].as_py(), mm["max"].as_py())
        at += rg.num_rows
    # DuckDB, its own reader: the same counts and sums.
    for name, (kind, values) in columns.items():
        if kind == "b":
            continue
        want = _expected(kind, values, specs[name].null)
        q = f"select count({name}), min({name}), max({name}) from '{path}'"
        got = duckdb.sql(q).fetchall()[0]
        mm = pc.min_max(want)
        assert got == (len(want) - want.null_count, mm["min"].as_py(), mm["max"].as_py())


def test_a_full_dictionary_falls_back_to_plain_pages(tmp_path):
    """More distinct values than a dictionary holds: the chunk's later
    pages are PLAIN, and everything reads back."""
    n = pp.DICT_LIMIT + 5000
    values = np.arange(n, dtype=np.int64) * 7919
    cols = {"v": ("i64", values)}
    _write(tmp_path / "f.parquet", cols, [20000, 40000, 60000], [], {"dictionary": ["v"]}, {})
    got = pq.read_table(tmp_path / "f.parquet").column("v").to_numpy()
    np.testing.assert_array_equal(got, values)
    encodings = pq.read_metadata(tmp_path / "f.parquet").row_group(0).column(0).encodings
    assert "PLAIN" in encodings and "RLE_DICTIONARY" in encodings


def test_a_chunk_after_a_full_dictionary_starts_from_an_empty_one(tmp_path):
    """A chunk whose first page fills the dictionary is written PLAIN, and
    the next chunk's dictionary starts empty: values the full one held
    are not found there (indices past the next chunk's dictionary)."""
    n = pp.DICT_LIMIT + 5000
    full = np.arange(n, dtype=np.int64) * 7919
    again = np.tile(full[[10, 20, 30]], 100)
    schema = pa.schema([("a", pa.int64()), ("b", pa.int64())])
    specs = column_specs(schema, {"dictionary": ["a", "b"]}, {})
    w = ParquetFileWriter(tmp_path / "f.parquet", schema, specs, None, "zstd")
    w.write_row_group([({"a": full, "b": np.resize(again, n)}, n)])
    w.close()
    got = pq.read_table(tmp_path / "f.parquet")
    np.testing.assert_array_equal(got.column("a").to_numpy(), full)
    np.testing.assert_array_equal(got.column("b").to_numpy(), np.resize(again, n))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    limit=st.integers(1, 40),
    styles=st.lists(st.sampled_from(["random", "few", "runs", "zeros"]), min_size=3, max_size=3),
    groups=st.lists(st.lists(st.integers(1, 120), min_size=1, max_size=3), min_size=1,
                    max_size=4),
    null=st.sampled_from([pp.NOT_NULL, pp.NULL_IF_NEGATIVE]),
)  # fmt: skip
def test_dictionaries_that_fill_up_on_any_page_read_back(tmp_path_factory, seed, limit, styles,
                                                         groups, null):  # fmt: skip
    """Dictionary columns whose dictionary fills up on any page (a
    dictionary of ``limit`` entries: the writers' scratch made so), in
    chunks one after another sharing it: every value reads back."""
    from hwtrace.export.parquet_file import _Scratch

    rng = np.random.default_rng(seed)
    n = sum(map(sum, groups))
    kinds = ["i64", "i32", "u64"]
    cols = {f"c{i}": (k, _values(k, n, style, rng))
            for i, (k, style) in enumerate(zip(kinds, styles, strict=True))}  # fmt: skip
    schema = pa.schema([(name, TYPES[k]) for name, (k, _) in cols.items()])
    nulls = {name: null for name, (k, _) in cols.items() if k != "u64"}
    specs = column_specs(schema, {"dictionary": list(cols)}, nulls)
    scratch = _Scratch()
    scratch.entries = np.zeros(limit, np.int64)
    path = tmp_path_factory.mktemp("pq") / "f.parquet"
    w = ParquetFileWriter(path, schema, specs, None, "zstd", scratch)
    at = 0
    for sizes in groups:
        pieces = []
        for m in sizes:
            pieces.append(({name: v[at : at + m] for name, (_, v) in cols.items()}, m))
            at += m
        w.write_row_group(pieces)
    w.close()
    got = pq.read_table(path)
    for name, (k, v) in cols.items():
        assert got.column(name).combine_chunks().equals(_expected(k, v, nulls.get(name, 0)))


@pytest.mark.parametrize("values", [
    [np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, -1, np.iinfo(np.int64).min],
    [5] * 300, list(range(129)), [1], [7, 7], list(range(0, 3 * 257, 3)),
    [0] * 200 + [1 << 40] + [2] * 100,
])  # fmt: skip
def test_delta_pages_wrap_as_the_format_says(tmp_path, values):
    """Deltas that overflow int64 wrap (DELTA_BINARY_PACKED is modular);
    constant runs, a block and one value over, a single value, pages of
    one delta throughout, one jump among equal values."""
    a = np.array(values, np.int64)
    _write(tmp_path / "d.parquet", {"v": ("i64", a)}, [], [], {"delta": ["v"]}, {})
    np.testing.assert_array_equal(pq.read_table(tmp_path / "d.parquet").column("v").to_numpy(), a)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 2000),
    run_len=st.sampled_from([1, 2, 5, 40, 300]),
    step=st.sampled_from(["bytes", "small", "wide", "mixed", "signed"]),
    null=st.sampled_from([pp.NOT_NULL, pp.NULL_IF_NEGATIVE]),
)
def test_a_delta_page_of_runs_is_the_laid_out_page_byte_for_byte(seed, n, run_len, step, null):
    """A column given as runs (a stream's times and trace offsets) makes
    the very page its values laid out make: blocks without a change,
    blocks whose changes are few and rising (packed by setting their
    bits), and the rest; with nulls among the runs."""
    from hwtrace.columns import Runs, joined
    from hwtrace.export.parquet_file import _runs_page, _Scratch

    rng = np.random.default_rng(seed)
    cuts = np.flatnonzero(rng.random(n - 1) < 1 / run_len) + 1 if n > 1 else []
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    k = starts.shape[0]
    steps = {
        "bytes": rng.integers(1, 8, k), "small": rng.integers(1, 1 << 9, k),
        "wide": rng.integers(1, 1 << 62, k), "signed": rng.integers(-9, 9, k),
        "mixed": np.where(rng.random(k) < 0.8, rng.integers(1, 4, k), rng.integers(1, 1 << 40, k)),
    }[step]  # fmt: skip
    values = np.cumsum(steps).astype(np.int64)
    if null == pp.NULL_IF_NEGATIVE:
        values[rng.random(k) < 0.1] = -1
    starts, values = joined(starts, values)
    runs = Runs(starts, values, n)
    got_state, want_state = np.zeros(pp.ST_SIZE, np.int64), np.zeros(pp.ST_SIZE, np.int64)
    s = _Scratch()
    s.grow(n)
    got = _runs_page(runs, null, got_state, s)
    laid = np.asarray(runs)
    size = pp.encode_delta(laid, n, null, want_state, s.levels, s.wide, s.deltas, s.out)
    assert got == s.out[:size].tobytes()
    np.testing.assert_array_equal(got_state, want_state)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 1500),
    every=st.sampled_from([0, 1, 2, 5, 40, 300]),
    steps=st.sampled_from(["bytes", "far", "back", "same_row"]),
    held=st.booleans(),
    cut=st.integers(0, 3),
)
def test_a_delta_page_of_offset_points_is_the_laid_out_page(seed, n, every, steps, held, cut):
    """Trace offsets given as a block store's offset points (a stream's
    batches to Parquet) make the very page their values laid out make:
    changes a byte each, far ones, offsets going back (blocks laid out),
    several changes at one row (the last holds), a held row first, and a
    batch's first rows (its last held back)."""
    from hwtrace.columns import OffsetPoints, Runs
    from hwtrace.export.parquet_file import ColumnSpec, _points_page, _Scratch
    from hwtrace.pt.blocks import OFF_BYTES, OFF_FAR, OFF_ROWS, offsets_of
    from hwtrace.session._attribution import offset_runs

    rng = np.random.default_rng(seed)
    pts, far_row, far_val = [], [], []
    row, value = 0, int(rng.integers(0, 1 << 40))
    prev = (row, value)
    for i in range(n // max(every, 1) + 2):
        if i:
            # (every 0: a change at every row, blocks with no delta of 0)
            dr = 1 if every == 0 else int(rng.integers(0 if steps == "same_row" else 1,
                                                       2 * every + 1))  # fmt: skip
            dv = {
                "bytes": int(rng.integers(1, 16)),
                "far": int(rng.integers(1, 1 << 20)),
                "back": int(rng.integers(-40, 40)),
                "same_row": int(rng.integers(0, 9)),
            }[steps]
            row, value = row + dr, max(value + dv, 0)
        if i and 0 <= row - prev[0] < OFF_ROWS and 0 <= value - prev[1] < OFF_BYTES:
            pts.append((row - prev[0]) << 4 | (value - prev[1]))
        else:
            pts.append(OFF_FAR)
            far_row.append(row)
            far_val.append(value)
        prev = (row, value)
    points = (np.array(pts, np.uint8), np.array(far_row, np.int64), np.array(far_val, np.int64))
    at = 1 if held else 0
    total = n + at
    first = int(rng.integers(0, 1 << 40)) if held else None
    want = np.empty(total, np.int64)
    if held:
        want[0] = first
    offsets_of(*points, n, want[at:])
    col = OffsetPoints(total, first, points, at,
                       lambda: Runs(*offset_runs(first, *points, at, total), total))  # fmt: skip
    rows = max(total - cut, 1)
    if rows < total:
        col, want = col[:rows], want[:rows]
        assert isinstance(col, OffsetPoints)
    spec = ColumnSpec("trace_offset", pa.int64(), "delta", pp.NULL_IF_NEGATIVE)
    got_state, want_state = np.zeros(pp.ST_SIZE, np.int64), np.zeros(pp.ST_SIZE, np.int64)
    s = _Scratch()
    s.grow(rows)
    got = _points_page(col, rows, spec, got_state, s)
    size = pp.encode_delta(want, rows, pp.NULL_IF_NEGATIVE, want_state, s.levels, s.wide,
                           s.deltas, s.out)  # fmt: skip
    assert got == s.out[:size].tobytes()
    np.testing.assert_array_equal(got_state, want_state)
    np.testing.assert_array_equal(np.asarray(col), want)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    kinds=st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=4),
    encodings=st.lists(st.sampled_from(["dictionary", "delta", "plain"]), min_size=4, max_size=4),
    groups=st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=3), min_size=1, max_size=6),
    choices=st.lists(st.integers(0, 2), min_size=24, max_size=24),
)
def test_columns_of_one_value_given_as_broadcasts_write_the_same_bytes(
    tmp_path_factory, seed, kinds, encodings, groups, choices
):
    """A column given as a broadcast of one value (how the flow's writer
    passes a queue's number) is written once and its chunk's bytes reused:
    two files written so, sharing the writers' scratch, hold the same bytes
    as with every value in memory."""
    from hwtrace.export.parquet_file import _Scratch

    rng = np.random.default_rng(seed)
    names = [f"c{i}_{k}" for i, k in enumerate(kinds)]
    schema = pa.schema([(name, TYPES[k]) for name, k in zip(names, kinds, strict=True)])
    encoding: dict[str, list[str]] = {"dictionary": [], "delta": []}
    for name, enc in zip(names, encodings[: len(names)], strict=True):
        if enc != "plain":
            encoding[enc].append(name)
    nulls = {name: pp.NULL_IF_NEGATIVE for name, k in zip(names, kinds, strict=True)
             if k in ("i32", "i64")}  # fmt: skip
    specs = column_specs(schema, encoding, nulls)
    # Per column a few values, picked per row group.
    pools = {name: _values(k, 3, "random", rng) for name, k in zip(names, kinds, strict=True)}
    out = {}
    for style in ("broadcast", "arrays"):
        scratch = _Scratch()
        for f in range(2):
            path = tmp_path_factory.mktemp("pq") / f"{style}-{f}.parquet"
            w = ParquetFileWriter(path, schema, specs, None, "zstd", scratch)
            for g, sizes in enumerate(groups):
                pieces = []
                for p, n in enumerate(sizes):
                    cols = {}
                    for c, name in enumerate(names):
                        v = pools[name][choices[(g * 3 + p + c + f) % len(choices)]]
                        one = np.broadcast_to(v, (n,))
                        cols[name] = one if style == "broadcast" else one.copy()
                    pieces.append((cols, n))
                w.write_row_group(pieces)
            w.close()
            out[style, f] = path.read_bytes()
    for f in range(2):
        assert out["broadcast", f] == out["arrays", f]
    assert pq.read_table(pa.BufferReader(out["broadcast", 1])).num_rows == sum(map(sum, groups))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.integers(-(2**40), 2**40),
    groups=st.lists(st.lists(st.integers(1, 700), min_size=1, max_size=3), min_size=1, max_size=4),
    encoding=st.sampled_from(["delta", "plain", "dictionary"]),
)
def test_row_numbers_write_what_their_values_do(tmp_path_factory, first, groups, encoding):
    """A column of row numbers given as RowNumbers (not held in memory) is
    written byte for byte as the same numbers in an array are, in pages
    of any length (a delta page is made without the encoder)."""
    from hwtrace.export.parquet_file import RowNumbers

    schema = pa.schema([("row", pa.int64()), ("x", pa.int32())])
    enc = {"dictionary": [], "delta": []}
    if encoding != "plain":
        enc[encoding].append("row")
    specs = column_specs(schema, enc, {})
    out = {}
    for style in ("lazy", "array"):
        path = tmp_path_factory.mktemp("pq") / f"{style}.parquet"
        w = ParquetFileWriter(path, schema, specs, None, "zstd")
        at = first
        for sizes in groups:
            pieces = []
            for n in sizes:
                rows = RowNumbers(at - 5, n + 9)[5 : 5 + n]  # (a slice, as partitions cut)
                col = rows if style == "lazy" else np.arange(at, at + n, dtype=np.int64)
                pieces.append(({"row": col, "x": np.full(n, 7, np.int32)}, n))
                at += n
            w.write_row_group(pieces)
        w.close()
        out[style] = path.read_bytes()
    assert out["lazy"] == out["array"]
    got = pq.read_table(pa.BufferReader(out["lazy"])).column("row").to_numpy()
    np.testing.assert_array_equal(got, np.arange(first, at))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n_keys=st.integers(1, 3000),
    groups=st.lists(st.lists(st.integers(1, 900), min_size=1, max_size=3), min_size=1, max_size=4),
    nulls=st.sampled_from([pp.NOT_NULL, pp.NULL_IF_ZERO, pp.NULL_IF_NEGATIVE]),
    sources=st.integers(1, 3),
    ahead=st.booleans(),
)
def test_keyed_columns_write_what_their_values_do(
    tmp_path_factory, seed, n_keys, groups, nulls, sources, ahead
):
    """Columns given as Keyed (each row's block key into a table of values
    per block, as the flow's block columns are) are written byte for byte
    as their values in arrays are: a column with a value per key, one with
    few values (a key's instruction count), one of one value, one with
    nulls (written from its values), sharing their keys, in row groups of
    pieces whose tables grow as the decoder's does; pieces of several
    sources (queues, each its own table) in one chunk too; written on the
    calling thread or ahead on the compressing thread."""
    from hwtrace.export.parquet_file import Keyed

    rng = np.random.default_rng(seed)
    # (the sources' addresses overlap: a value may be two sources' keys)
    addresses = np.arange(1 << 40, (1 << 40) + 24 * n_keys, 16, dtype=np.uint64)
    tables = [
        {
            "ip": rng.choice(addresses, n_keys, replace=False),
            "ninsn": rng.integers(1, 6, n_keys).astype(np.int64),
            "one": np.full(n_keys, 7, np.int64),
            "sym": rng.integers(-3, 4, n_keys).astype(np.int64),
        }
        for _ in range(sources)
    ]
    schema = pa.schema([("ip", pa.uint64()), ("ninsn", pa.int64()), ("one", pa.int64()),
                        ("sym", pa.int64())])  # fmt: skip
    specs = column_specs(schema, {"dictionary": list(tables[0])}, {"sym": nulls})
    # Rows name the keys known so far (the table grows along the rows);
    # some pieces of one key.
    total = sum(map(sum, groups))
    keys = np.minimum(rng.integers(0, n_keys, total),
                      np.arange(total) * n_keys // max(total, 1)).astype(np.uint32)  # fmt: skip
    out = {}
    ips: list[np.ndarray] = []  # each row's address, as written
    for style in ("keyed", "sequenced", "arrays"):
        path = tmp_path_factory.mktemp("pq") / f"{style}.parquet"
        w = ParquetFileWriter(path, schema, specs, None, "zstd", ahead=ahead)
        at = 0
        ips.clear()
        for g, sizes in enumerate(groups):
            pieces = []
            for p, n in enumerate(sizes):
                k = keys[at : at + n]
                if (g + p) % 3 == 2:
                    k = np.full(n, k[0], np.uint32)
                src = (3 * g + p) % sources
                known = int(k.max()) + 1
                named = _in_sequences(k, rng) if style == "sequenced" else k
                if style == "sequenced" and p % 2:
                    pp.named_keys(named, tables[src]["ninsn"][:known])  # (first-seen order known)
                cols = {c: t[k] if style == "arrays" else Keyed(named, t[:known], src)
                        for c, t in tables[src].items()}  # fmt: skip
                pieces.append((cols, n))
                ips.append(tables[src]["ip"][k])
                at += n
            w.write_row_group(pieces)
        w.close()
        out[style] = path.read_bytes()
    assert out["keyed"] == out["arrays"]
    assert out["sequenced"] == out["arrays"]
    t = pq.read_table(pa.BufferReader(out["keyed"]))
    np.testing.assert_array_equal(t["ip"].to_numpy(), np.concatenate(ips))


def _in_sequences(keys: np.ndarray, rng: np.random.Generator) -> SequencedKeys:
    """``keys`` as a block store keeps them: stretches of 2 to 20 rows (a
    loop's replays, longer than a word's copy too) as sequences, a stretch
    met again as the same one, and sequences no row names in the pool."""
    top = 0xFFFE
    starts, lengths, pool, entries = [], [], [], []
    known: dict[bytes, int] = {}
    for _ in range(int(rng.integers(0, 3))):  # (left from earlier batches)
        starts.append(len(pool))
        lengths.append(3)
        pool += [0, 0, 0]
    i = 0
    while i < keys.shape[0]:
        m = int(rng.integers(2, 21))
        if rng.random() < 0.5 or i + m > keys.shape[0]:
            entries.append(int(keys[i]))
            i += 1
            continue
        stretch = keys[i : i + m]
        q = known.get(stretch.tobytes())
        if q is None:
            q = known[stretch.tobytes()] = len(starts)
            starts.append(len(pool))
            lengths.append(m)
            pool += stretch.tolist()
        entries.append(top - q)
        i += m
    floor = top + 1 - len(starts)
    assert int(keys.max()) < floor
    laid_out = keys.astype(np.uint16)
    return SequencedKeys(keys.shape[0], np.array(entries, np.uint16), floor, top,
                         np.array(starts, np.int64), np.array(lengths, np.int64),
                         np.array(pool, np.uint16), lambda: laid_out)  # fmt: skip


def test_keys_in_sequences_lay_out_and_count_as_their_rows():
    """Keys kept in sequences (as a block store keeps a loop's replays)
    count as their rows do, and their layout is the rows' keys."""
    from hwtrace.pt.blocks import expand_entries

    rng = np.random.default_rng(3)
    keys = np.repeat(rng.integers(0, 40, 500), rng.integers(1, 4, 500)).astype(np.uint32)
    seq = _in_sequences(keys, rng)
    out = np.zeros(keys.shape[0], np.uint16)
    expand_entries(seq.entries, seq.floor, seq.seq_start, seq.seq_len, seq.seq_keys, out)
    np.testing.assert_array_equal(out, keys)
    values = np.arange(40, dtype=np.int64) * 3 + 1
    named, total = pp.named_keys(seq, values)
    np.testing.assert_array_equal(named, np.bincount(keys, minlength=40) > 0)
    assert total == int(values[keys].sum())
    _, first = np.unique(keys, return_index=True)
    np.testing.assert_array_equal(seq.order, keys[np.sort(first)])  # (first-seen order)
    assert seq.last() == keys[-1]
    # The first rows (a batch but its last rows; or those of a partition,
    # far from the end), kept in sequences still.
    for cut in (1, 2, 5, 17, *range(60, 70), 200, 333, 334, 335, keys.shape[0] - 1):
        first = seq[: keys.shape[0] - cut]
        assert isinstance(first, SequencedKeys) and len(first) == keys.shape[0] - cut
        out = np.zeros(len(first), np.uint16)
        expand_entries(first.entries, first.floor, first.seq_start, first.seq_len,
                       first.seq_keys, out)  # fmt: skip
        np.testing.assert_array_equal(out, keys[: len(first)])
        np.testing.assert_array_equal(np.asarray(first), keys[: len(first)])
    # (a cut is the keys' while anyone holds it, and goes when nobody does:
    # no cycle keeps a batch's keys for the collector)
    assert seq[:5] is seq[:5]
    gone = weakref.ref(seq[:5])
    assert gone() is None


def test_keyed_values_read_as_their_table_at_their_keys():
    from hwtrace.export.parquet_file import Keyed

    table = np.array([5, 9, 11], np.uint64)
    k = Keyed(np.array([2, 0, 0, 1], np.uint32), table)
    assert k.shape == (4,) and len(k) == 4 and k.dtype == np.uint64
    np.testing.assert_array_equal(np.asarray(k), [11, 5, 5, 9])
    np.testing.assert_array_equal(np.asarray(k[1:3]), [5, 5])
    np.testing.assert_array_equal(np.asarray(k, np.int64), [11, 5, 5, 9])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    groups=st.lists(st.lists(st.integers(1, 1500), min_size=1, max_size=3), min_size=1, max_size=3),
    change=st.sampled_from([0.0, 0.003, 0.05, 0.3, 1.0]),
    steps=st.sampled_from(["rising", "any", "huge", "spikes"]),
    nulls=st.sampled_from([pp.NOT_NULL, pp.NULL_IF_NEGATIVE, pp.NULL_IF_ZERO]),
    cut=st.integers(0, 40),
)
def test_runs_write_what_their_values_do(tmp_path_factory, seed, groups, change, steps, nulls,
                                         cut):  # fmt: skip
    """A column given as Runs (a block's time, its duration) is written
    byte for byte as its values in an array are: as a delta column (runs
    of null values among them), and as a dictionary column whose pages go
    delta once its dictionary is full; pieces cut from longer runs as the
    partitions cut them."""
    from hwtrace.columns import Runs

    rng = np.random.default_rng(seed)
    total = sum(map(sum, groups))
    moves = rng.random(total + cut) < change
    if steps == "rising":
        step = rng.integers(1, 5000, total + cut)
    elif steps == "any":
        step = rng.integers(-300, 300, total + cut)
    elif steps == "huge":
        step = rng.integers(-(1 << 62), 1 << 62, total + cut)
    else:
        step = np.zeros(total + cut, np.int64)
    values = np.cumsum(np.where(moves, step, 0)).astype(np.int64)
    if steps == "spikes":
        # (a duration: 0 but at the rows where a time changes)
        values = np.where(moves, rng.integers(1, 400, total + cut), 0).astype(np.int64)
    if nulls != pp.NOT_NULL and total:
        values[rng.random(total + cut) < 0.01] = 0 if nulls == pp.NULL_IF_ZERO else -1
    schema = pa.schema([("d", pa.int64()), ("t", pa.int64())])
    specs = column_specs(schema, {"dictionary": ["d"], "delta": ["d", "t"]}, {"t": nulls})
    out = {}
    for style in ("runs", "arrays"):
        path = tmp_path_factory.mktemp("pq") / f"{style}.parquet"
        w = ParquetFileWriter(path, schema, specs, None, "zstd")
        runs = Runs.of(values, 1)
        at = cut
        for sizes in groups:
            pieces = []
            for n in sizes:
                col = runs[at : at + n] if style == "runs" else values[at : at + n]
                pieces.append(({"d": col, "t": col}, n))
                at += n
            w.write_row_group(pieces)
        w.close()
        out[style] = path.read_bytes()
    assert out["runs"] == out["arrays"]
    t = pq.read_table(pa.BufferReader(out["runs"]))
    np.testing.assert_array_equal(t["d"].to_numpy(), values[cut:])


def test_a_dictionary_of_runs_goes_delta_when_full(tmp_path):
    """More distinct values than a dictionary holds, given as runs: the
    chunk's later pages are DELTA_BINARY_PACKED, the same bytes as from
    the values, read back by Arrow."""
    from hwtrace.columns import Runs

    values = np.repeat(np.arange(pp.DICT_LIMIT + 5000, dtype=np.int64) * 7919, 2)
    schema = pa.schema([("d", pa.int64())])
    specs = column_specs(schema, {"dictionary": ["d"], "delta": ["d"]}, {})
    out = {}
    for style in ("runs", "arrays"):
        path = tmp_path / f"{style}.parquet"
        w = ParquetFileWriter(path, schema, specs)
        cuts = [0, 50000, 100000, 140000, values.shape[0]]
        w.write_row_group([({"d": Runs.of(values[lo:hi]) if style == "runs" else values[lo:hi]},
                            hi - lo) for lo, hi in itertools.pairwise(cuts)])  # fmt: skip
        w.close()
        out[style] = path.read_bytes()
        encodings = pq.read_metadata(path).row_group(0).column(0).encodings
        assert "DELTA_BINARY_PACKED" in encodings and "RLE_DICTIONARY" in encodings
    assert out["runs"] == out["arrays"]
    got = pq.read_table(pa.BufferReader(out["runs"])).column("d").to_numpy()
    np.testing.assert_array_equal(got, values)


def test_runs_read_as_their_values():
    from hwtrace.columns import Runs

    values = np.array([4, 4, 4, 9, 9, -1, 4, 4], np.int64)
    r = Runs.of(values, 1)
    assert isinstance(r, Runs) and r.shape == (8,) and len(r) == 8
    np.testing.assert_array_equal(r.starts, [0, 3, 5, 6])
    np.testing.assert_array_equal(np.asarray(r), values)
    for lo, hi in [(0, 8), (1, 4), (3, 5), (5, 6), (7, 8), (4, 4), (6, 3)]:
        np.testing.assert_array_equal(np.asarray(r[lo:hi]), values[lo:hi])
    # (more runs than one row in ``most`` starts: the values themselves)
    assert Runs.of(values, 4) is values


# (null rules are for signed integers; booleans are PLAIN or dictionary)
_ONE_VALUE_CASES = [
    (kind, encoding, null)
    for kind in ("i32", "i64", "u8", "u64", "b")
    for encoding in ("dictionary", "delta", "plain")
    for null in (pp.NOT_NULL, pp.NULL_IF_NEGATIVE, pp.NULL_IF_ZERO)
    if not (kind == "b" and encoding == "delta") and (kind in ("i32", "i64") or null == pp.NOT_NULL)
]


@pytest.mark.parametrize(("kind", "encoding", "null"), _ONE_VALUE_CASES)
def test_chunks_of_one_value_write_what_the_values_do(tmp_path, kind, encoding, null):
    """A column of one value given as a broadcast (a queue's number, its
    thread) is encoded without its rows laid out; its pages are those of
    the same values in an array, byte for byte, null or not, in pieces of
    sizes no multiple of eight, and Arrow reads them back."""
    info = np.iinfo(NP[kind]) if kind != "b" else None
    values = [True, False] if kind == "b" else [0, -1 if info.min < 0 else info.max, 7,
                                                 info.max, info.min]  # fmt: skip
    schema = pa.schema([("c", TYPES[kind])])
    specs = column_specs(schema, {encoding: ["c"]}, {"c": null} if kind != "b" else {})
    for v in values:
        out = {}
        for style in ("broadcast", "array"):
            path = tmp_path / f"{style}.parquet"
            w = ParquetFileWriter(path, schema, specs, None, "zstd")
            for sizes in ([1001], [8, 13], [1001]):  # (the last: as the first, remembered)
                col = np.full(sum(sizes), v, NP[kind])
                if style == "broadcast":
                    col = np.broadcast_to(col[:1], col.shape)
                w.write_row_group([({"c": col}, n) for n in sizes])
            w.close()
            out[style] = path.read_bytes()
        assert out["broadcast"] == out["array"], v
        got = pq.read_table(pa.BufferReader(out["broadcast"])).column("c")
        assert len(got) == 2023


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from([0, 2]),
    sizes=st.lists(st.integers(0, 2**31 - 1), min_size=3, max_size=3),
    encoding=st.sampled_from([0, 3, 5, 8]),
)
def test_page_headers_laid_out_at_once_are_thrifts(kind, sizes, encoding):
    """The page header the writer lays out at once is the Thrift struct
    field by field (the compact protocol's encoder beside it)."""
    from hwtrace.export.parquet_file import _RLE, _page_header, _Struct

    size, stored, n = sizes
    h = _Struct().i32(1, kind).i32(2, size).i32(3, stored)
    if kind == 0:
        h.struct(5, _Struct().i32(1, n).i32(2, encoding).i32(3, _RLE).i32(4, _RLE))
    else:
        h.struct(7, _Struct().i32(1, n).i32(2, encoding))
    assert _page_header(kind, size, stored, n, encoding) == h.done()


@settings(max_examples=300, deadline=None)
@given(
    physical=st.sampled_from([0, 1, 2]),
    encodings=st.lists(st.integers(0, 9), min_size=1, max_size=20),
    name=st.text(min_size=1, max_size=200),
    codec=st.sampled_from([0, 6]),
    numbers=st.lists(st.integers(0, 2**62), min_size=6, max_size=6),
    dictionary=st.booleans(),
    bounds=st.one_of(
        st.none(), st.tuples(st.binary(min_size=1, max_size=8), st.binary(min_size=1, max_size=8))
    ),
)
def test_column_chunks_laid_out_at_once_are_thrifts(physical, encodings, name, codec, numbers,
                                                    dictionary, bounds):  # fmt: skip
    """A row group's column chunk laid out at once is the Thrift struct
    field by field, with and without a dictionary page and statistics."""
    from hwtrace.export.parquet_file import _column_chunk, _Struct

    values, size, stored, data_at, dict_at, nulls = numbers
    stats = _Struct().i64(3, nulls)
    if bounds is not None:
        stats.binary(5, bounds[0]).binary(6, bounds[1])
    meta = (_Struct().i32(1, physical).i32s(2, encodings).strings(3, [name]).i32(4, codec)
            .i64(5, values).i64(6, size).i64(7, stored).i64(9, data_at))  # fmt: skip
    if dictionary:
        meta.i64(11, dict_at)
    meta.struct(12, stats)
    want = _Struct().i64(2, 0).struct(3, meta).done()
    got = _column_chunk(physical, encodings, name.encode(), codec, values, size, stored, data_at,
                        dict_at if dictionary else None, nulls, bounds)  # fmt: skip
    assert got.done() == want


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 3000),
    m=st.sampled_from([1, 3, 222, pp.COUNT_LANES_MAX, pp.COUNT_LANES_MAX + 1, 40000]),
    kind=st.sampled_from([np.uint16, np.uint32]),
    loop=st.booleans(),
)
def test_keys_counted_in_lanes_are_counted(seed, n, m, kind, loop):
    """The rows' count per key, in four lanes (a small table) or a row at
    a time (a large one), is numpy's, for keys at random and for a loop's
    few keys met again and again."""
    rng = np.random.default_rng(seed)
    if m > np.iinfo(kind).max:
        m = int(np.iinfo(kind).max)
    keys = (np.arange(n) % min(m, 5) if loop else rng.integers(0, m, n)).astype(kind)
    got = pp.key_counts(keys, m)
    assert (got == np.bincount(keys, minlength=m)).all()


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 700),
    width=st.integers(1, 8),
    runs=st.integers(1, 20),
)
def test_index_pages_of_few_values_are_made_a_word_at_a_time_alike(seed, n, width, runs):
    """A keyed column of at most 256 values has its index pages made from
    byte indices a word (eight rows) at a time: the same bytes as from
    wider indices (two bytes, four) a row at a time, with runs long and
    short, groups of one value, and a ragged last group."""
    rng = np.random.default_rng(seed)
    values = np.repeat(rng.integers(0, 1 << width, n), rng.integers(1, runs + 1, n))[:n]
    pages = []
    for kind in (np.int32, np.uint16, np.uint8):
        out = np.zeros(10 * n + 64, np.uint8)
        size = pp.index_page(values.astype(kind), n, width, out)
        pages.append(out[:size].tobytes())
    assert pages[0] == pages[1] == pages[2]


@pytest.mark.parametrize("width", range(9, 17))
def test_wide_indices_and_sparse_booleans_read_back(tmp_path, width):
    """Dictionary indices of 9 to 16 bits (a chunk of up to 65,536
    distinct values: packed as pairs, then quads, then halves)
    and a boolean column of rare set rows (eight clear rows a word) read
    back as written by Arrow."""
    rng = np.random.default_rng(width)
    distinct = (1 << (width - 1)) + 1 + int(rng.integers(0, 1 << (width - 1)))
    n = distinct + 1000
    pool = rng.permutation(np.arange(distinct, dtype=np.int64) * 7919)
    x = np.concatenate([pool, pool[rng.integers(0, distinct, n - distinct)]])
    flag = rng.random(n) < 0.001
    columns = {"x": ("i64", x), "flag": ("b", flag)}
    path = tmp_path / "wide.parquet"
    _write(path, columns, [n // 3], [], {"dictionary": ["x"]}, {})
    t = pq.read_table(path)
    assert t.column("x").to_numpy().tolist() == x.tolist()
    assert t.column("flag").to_numpy().tolist() == flag.tolist()
    meta = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert "RLE_DICTIONARY" in meta.encodings


def test_a_chunk_of_tiny_pages_is_stored_uncompressed(tmp_path):
    """zstd makes a page of a few bytes longer: a chunk whose pages are all
    that short (a column of one value) is stored as it is, the others
    compressed; both readers read both."""
    import duckdb

    n = 5000
    rng = np.random.default_rng(7)
    cols = {"one": ("i64", np.full(n, 42, np.int64)),
            "many": ("i64", rng.integers(0, 1 << 40, n))}  # fmt: skip
    path = tmp_path / "t.parquet"
    _write(path, cols, [1000, 3000], [1], {"dictionary": ["one"], "delta": ["many"]}, {})
    meta = pq.read_metadata(path)
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        codecs = {rg.column(c).path_in_schema: rg.column(c).compression for c in range(2)}
        assert codecs == {"one": "UNCOMPRESSED", "many": "ZSTD"}
    table = pq.read_table(path)
    np.testing.assert_array_equal(table.column("one").to_numpy(), cols["one"][1])
    np.testing.assert_array_equal(table.column("many").to_numpy(), cols["many"][1])
    got = duckdb.sql(f"select sum(one), sum(many) from '{path}'").fetchall()[0]
    assert got == (42 * n, int(cols["many"][1].sum()))


@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_each_compression_is_named_in_the_footer(tmp_path, compression):
    """The codec a chunk's pages were compressed with is the one its
    ColumnChunk names (readers decompress by it); ``none`` and tiny chunks
    say UNCOMPRESSED."""
    n = 20000
    rng = np.random.default_rng(3)
    # (a pattern repeated: every codec finds it)
    cols = {"one": ("i64", np.full(n, 7, np.int64)),
            "many": ("i64", np.tile(rng.integers(0, 1 << 40, 100), n // 100))}  # fmt: skip
    path = tmp_path / "t.parquet"
    _write(path, cols, [5000], [], {"dictionary": ["one"]}, {}, compression)
    # (Arrow names Parquet's LZ4_RAW, the raw block format, LZ4)
    named = {"zstd": "ZSTD", "lz4": "LZ4", "snappy": "SNAPPY", "none": "UNCOMPRESSED"}
    rg = pq.read_metadata(path).row_group(0)
    codecs = {rg.column(c).path_in_schema: rg.column(c).compression for c in range(2)}
    assert codecs == {"one": "UNCOMPRESSED", "many": named[compression]}
    table = pq.read_table(path)
    np.testing.assert_array_equal(table.column("many").to_numpy(), cols["many"][1])
    if compression != "none":
        assert rg.column(1).total_compressed_size < rg.column(1).total_uncompressed_size


def test_an_unknown_compression_is_refused(tmp_path):
    with pytest.raises(ValueError, match="one of zstd, lz4, snappy, none"):
        _write(tmp_path / "t.parquet", {"x": ("i64", np.arange(3))}, [], [], {}, {}, "gzip")


def test_a_write_that_fails_ahead_is_raised_by_close(tmp_path):
    """A row group written ahead, on the compressing thread, that fails
    (a full disk) is not lost: close raises its error."""

    class Full:
        def write(self, b):
            raise OSError(28, "No space left on device")

        def close(self):
            pass

    schema = pa.schema([("v", pa.int64())])
    specs = column_specs(schema, {"delta": ["v"]}, {})
    w = ParquetFileWriter(tmp_path / "f.parquet", schema, specs, None, "zstd", ahead=True)
    w.file.close()
    w.file = Full()
    w.write_row_group([({"v": np.arange(1000, dtype=np.int64)}, 1000)])
    # Another writer of the process, waiting for room among the row groups
    # written ahead, is not handed this one's failure.
    other = ParquetFileWriter(tmp_path / "g.parquet", schema, specs, None, "zstd", ahead=True)
    for _ in range(WRITES_AHEAD + 1):
        other.write_row_group([({"v": np.arange(1000, dtype=np.int64)}, 1000)])
    other.close()
    assert pq.read_table(tmp_path / "g.parquet").num_rows == 1000 * (WRITES_AHEAD + 1)
    with pytest.raises(OSError, match="No space"):
        w.close()


def test_a_file_closed_ahead_is_written_once_waited_for(tmp_path):
    """close_ahead hands the footer to the compressing thread, after the
    file's row groups: the caller goes on (another file's row groups) and
    the file is complete once wait returns."""
    schema = pa.schema([("v", pa.int64())])
    specs = column_specs(schema, {"delta": ["v"]}, {})
    w = ParquetFileWriter(tmp_path / "f.parquet", schema, specs, None, "zstd", ahead=True)
    assert not w.closed()
    for i in range(3):
        w.write_row_group([({"v": np.arange(i, i + 1000, dtype=np.int64)}, 1000)])
    w.close_ahead()
    other = ParquetFileWriter(tmp_path / "g.parquet", schema, specs, None, "zstd", ahead=True)
    other.write_row_group([({"v": np.arange(10, dtype=np.int64)}, 10)])
    w.wait()
    assert w.closed()
    t = pq.read_table(tmp_path / "f.parquet")
    assert t.num_rows == 3000 and pq.ParquetFile(tmp_path / "f.parquet").num_row_groups == 3
    other.close()
    assert pq.read_table(tmp_path / "g.parquet").num_rows == 10


def test_a_file_whose_write_failed_ahead_gets_no_footer(tmp_path):
    """A file closed ahead after one of its row groups failed to be
    written is closed without a footer (no reader takes it for complete)
    and wait raises the failure."""

    class FullOnce:
        def __init__(self):
            self.written, self.closed, self.failed = [], False, False

        def write(self, b):
            if not self.failed:
                self.failed = True
                raise OSError(28, "No space left on device")
            self.written.append(bytes(b))

        def close(self):
            self.closed = True

    schema = pa.schema([("v", pa.int64())])
    specs = column_specs(schema, {"delta": ["v"]}, {})
    w = ParquetFileWriter(tmp_path / "f.parquet", schema, specs, None, "zstd", ahead=True)
    w.file.close()
    w.file = f = FullOnce()
    w.write_row_group([({"v": np.arange(1000, dtype=np.int64)}, 1000)])
    w.close_ahead()
    while not w.closed():  # (the footer's turn has come: wait cancels no part of it)
        time.sleep(0.001)
    with pytest.raises(OSError, match="No space"):
        w.wait()
    assert f.closed and not any(b.endswith(b"PAR1") for b in f.written)


def test_scratch_keeps_its_buffers_for_batches_of_about_one_size():
    """The encoders' buffers are sized to a power of two of rows: a stream's
    first batch (a row short of the rest) and the next share them, not
    reallocated twice as large for one row more (fresh memory costs a
    page fault a page, and a stall when the kernel makes a huge page)."""
    from hwtrace.export.parquet_file import _Scratch

    s = _Scratch()
    s.grow((1 << 20) - 1)
    assert s.rows == 1 << 20
    buffers = (s.out, s.indices, s.wide, s.deltas, s.levels, s.index_raw)
    s.grow(1 << 20)
    assert all(a is b for a, b in zip(buffers, (s.out, s.indices, s.wide, s.deltas, s.levels,
                                                  s.index_raw), strict=True))  # fmt: skip
    s.grow((1 << 20) + 1)
    assert s.rows == 1 << 21


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    batches=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 90), st.integers(0, 3)),
                     min_size=1, max_size=14),
    row_group=st.integers(1, 60),
    budget=st.integers(1, 150),
    max_open=st.integers(1, 4),
    file_rows=st.integers(1, 120),
    background=st.booleans(),
)  # fmt: skip
def test_partitioned_rows_land_once_in_their_partition(tmp_path_factory, seed, batches,
                                                       row_group, budget, max_open, file_rows,
                                                       background):  # fmt: skip
    """Batches of rows of a few CPUs, each row in a time bucket (buckets
    rising, repeating, going back), written with few files open at once,
    small files, row groups and budgets of waiting rows: every row is in
    exactly one file, of its CPU's and bucket's partition, as given."""
    import hwtrace.export.parquet as P

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(P, "FILE_ROWS", file_rows)
        got, want = _write_partitioned(P, tmp_path_factory.mktemp("ds"), seed, batches,
                                       row_group, budget, max_open, background)  # fmt: skip
    assert sorted(got) == sorted(want)


def _write_partitioned(P, root, seed, batches, row_group, budget, max_open, background):
    import pyarrow.dataset as pads

    rng = np.random.default_rng(seed)
    schema = pa.schema([("cpu", pa.int32()), ("x", pa.int64()), ("y", pa.int32())])
    io = P._Io(background)
    w = P._Partitioned(root, schema, {}, row_group=row_group, budget=budget, max_open=max_open,
                       compression="zstd", encoding={"dictionary": ["y"], "delta": ["x"]},
                       io=io)  # fmt: skip
    want = []
    at = 0
    for cpu, n, spread in batches:
        x = np.arange(at, at + n, dtype=np.int64)
        y = rng.integers(0, 4, n).astype(np.int32)
        bucket = np.sort(rng.integers(0, spread + 1, n)) if spread else int(rng.integers(0, 3))
        io.run(w.write, {"x": x, "y": y}, cpu, bucket)
        want += zip(x.tolist(), [cpu] * n, np.broadcast_to(bucket, (n,)).tolist(), y.tolist(),
                    strict=True)  # fmt: skip
        at += n
    # (closed from the calling thread, as FlowParquetWriter does: the
    # close waits for the writes given to the writer's thread)
    io.wait()
    w.close()
    io.stop()
    got = pads.dataset(root, format="parquet", partitioning="hive").to_table().to_pylist()
    return [(r["x"], r["cpu"], r["bucket"], r["y"]) for r in got], want


def test_the_decode_commands_choices_are_the_writers():
    from hwtrace.cli.decode import COMPRESSIONS as CHOICES

    assert CHOICES == tuple(COMPRESSIONS)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 3000),
    distinct=st.sampled_from([1, 5, 700, 5000]),
)
def test_a_keyed_dictionary_is_its_values_in_the_order_first_met(seed, n, distinct):
    """A keyed column's dictionary (its values in the order the keys first
    meet them, each key's index there) is the one numpy's sort makes, as
    the table grows from its smallest, and leaves the table empty."""
    from hwtrace.export.parquet_file import _Scratch

    rng = np.random.default_rng(seed)
    values = rng.integers(-(1 << 62), 1 << 62, distinct)[rng.integers(0, distinct, n)]
    s = _Scratch()
    index, dictionary = s.first_met(values)
    distinct_values, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first)
    assert (dictionary == distinct_values[order]).all()
    assert index.dtype == np.int32 and (dictionary[index] == values).all()
    assert (index == np.argsort(order)[inverse.reshape(-1)]).all()
    assert s.slots.shape[0] == pp.DICT_SLOTS_MIN and (s.all_slots == -1).all()


def test_a_keyed_dictionary_past_a_dictionarys_room_is_sorted_by_numpy():
    """More distinct values than a dictionary page holds: the same answer,
    from numpy's sort, the table left empty."""
    from hwtrace.export.parquet_file import _Scratch

    values = np.arange(pp.DICT_LIMIT + 10, dtype=np.int64)[::-1].copy()
    s = _Scratch()
    index, dictionary = s.first_met(values)
    assert (dictionary == values).all() and (index == np.arange(values.shape[0])).all()
    assert (s.all_slots == -1).all()
