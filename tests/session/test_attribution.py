"""The compiled per-batch attribution against its definition in numpy:
perf's TSC conversion, the thread a CPU's switches say ran, block
durations with tracing stops (:func:`hwtrace.pt.timing.durations`); and
the attribution of a block store's compact rows against that of the rows
it expands to."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.pt.blocks import BlockStore
from hwtrace.pt.timing import durations, tsc_to_ns
from hwtrace.session._attribution import attribute_rows, attribute_stored, durations_of

_OUT = (np.uint64, np.int64, np.uint8, np.int64, np.int32, np.int64, np.int64, np.int64,
        np.int64, np.int64)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 300),
    held=st.booleans(),
    per_thread=st.booleans(),
    have_conv=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_attribute_rows_is_the_numpy_definition(n, held, per_thread, have_conv, seed):
    rng = np.random.default_rng(seed)
    ip = rng.integers(0, 1 << 48, n, dtype=np.uint64)
    ninsn = rng.integers(1, 1000, n).astype(np.uint32)
    mode = rng.integers(0, 3, n).astype(np.uint8)
    # Times mostly rising, some unknown (0), some going back.
    time = np.cumsum(rng.integers(0, 5000, n)).astype(np.uint64) + np.uint64(1 << 30)
    time[rng.random(n) < 0.1] = 0
    back = rng.random(n) < 0.05
    time[back] //= np.uint64(2)
    image = rng.integers(0, 3, n).astype(np.int64) if seed % 2 else np.array([2], np.int64)
    run = rng.integers(-1, 50, n).astype(np.int32) if seed % 3 else np.zeros(0, np.int32)
    offset = rng.integers(0, 1 << 30, n) if seed % 5 else np.zeros(0, np.int64)
    shift, mult, zero = 10, int(rng.integers(1, 1 << 20)), int(rng.integers(-(1 << 40), 1 << 40))
    conv = np.array([int(have_conv), shift, mult, zero % (1 << 64)], np.uint64)
    ns = np.where(time != 0, tsc_to_ns(time, shift, mult, zero).astype(np.int64), -1)
    if not have_conv:
        ns[:] = -1
    switch_time = np.sort(rng.integers(0, max(int(ns.max()) + 2 if n else 0, 10), 6))
    switch_tid = rng.integers(-1, 100, 6)
    switch_pid = np.where(switch_tid >= 0, switch_tid + 1000, -1)
    if per_thread:
        tid, pid = 42, 4242
        tids = np.full(n, tid)
        pids = np.full(n, pid)
    else:
        tid = pid = -1
        k = np.searchsorted(switch_time, np.maximum(ns, 0), side="right") - 1
        tids = np.where(k >= 0, switch_tid[np.maximum(k, 0)], -1)
        pids = np.where(k >= 0, switch_pid[np.maximum(k, 0)], -1)
    h = int(held)
    total = n + h
    outs = [np.zeros(total, t) for t in _OUT]
    if held:
        for o, v in zip(outs, (7, 3, 1, 1, 5, 9, 123, 8, 9), strict=False):
            o[0] = v
    stop_row = np.sort(rng.integers(0, max(total, 1), int(rng.integers(0, 4)) if total else 0))
    stop_tsc = rng.integers(0, 1 << 34, stop_row.shape[0]).astype(np.uint64)
    attribute_rows(ip, ninsn, mode, time, image, run, offset, h, conv, tid, pid,
                   switch_time, switch_tid, switch_pid, *outs[:-1])  # fmt: skip
    durations_of(outs[6], outs[9], stop_row, stop_tsc, conv)
    o_ip, o_ninsn, o_mode, o_image, o_run, o_offset, o_ns, o_tid, o_pid, o_dur = outs
    np.testing.assert_array_equal(o_ip[h:], ip)
    np.testing.assert_array_equal(o_ninsn[h:], ninsn)
    np.testing.assert_array_equal(o_mode[h:], mode)
    np.testing.assert_array_equal(o_image[h:], np.broadcast_to(image, (n,)) if n else image[:0])
    np.testing.assert_array_equal(o_run[h:], run if run.shape[0] == n else -1)
    np.testing.assert_array_equal(o_offset[h:], offset if offset.shape[0] == n else -1)
    np.testing.assert_array_equal(o_ns[h:], ns)
    np.testing.assert_array_equal(o_tid[h:], tids)
    np.testing.assert_array_equal(o_pid[h:], pids)
    if held:
        assert (o_ip[0], o_ns[0], o_tid[0]) == (7, 123, 8)
    all_ns = o_ns[:total]
    stop_ns = np.where(stop_tsc != 0, tsc_to_ns(stop_tsc, shift, mult, zero).astype(np.int64), 0)
    values = np.where((stop_tsc != 0) & have_conv, stop_ns - all_ns[stop_row], 0)
    np.testing.assert_array_equal(o_dur, durations(all_ns, stop_row, values))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400), held=st.booleans(), per_thread=st.booleans(),
       seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_attribute_stored_is_attribute_rows_of_the_rows(n, held, per_thread, seed):
    """A block store's rows attributed from its compact form are the rows
    it expands to, attributed."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 1 << 40, 9, dtype=np.uint64)
    pick = rng.integers(0, 9, n)
    ip, ninsn, mode = pool[pick], (pick + 1).astype(np.uint32), (pick % 2).astype(np.uint8)
    # Offsets and times that change every few rows, with some large steps.
    offset = np.cumsum(rng.integers(0, 3, n) * rng.choice([1, 40, 1 << 22], n)).astype(np.int64)
    time = np.repeat(np.cumsum(rng.integers(0, 900, n)), rng.integers(1, 5, n))[:n]
    time = time.astype(np.uint64) + np.uint64(1 << 20)
    time[rng.random(n) < 0.05] = 0
    store = BlockStore(16)
    store.append(ip, ninsn, mode, offset, time, image=3)
    conv = np.array([1, 8, 300, 77], np.uint64)
    switch_time = np.sort(rng.integers(0, 1 << 22, 5))
    switch_tid = rng.integers(0, 50, 5)
    threads = ((conv, 9, 99, *(np.zeros(0, np.int64),) * 3) if per_thread else
               (conv, -1, -1, switch_time, switch_tid, switch_tid + 7))  # fmt: skip
    h = int(held)
    stop_row = np.array([n + h - 1, n // 2], np.int64)
    stop_tsc = np.array([int(time.max()) + 50, 0], np.uint64)
    got = [np.zeros(n + h, t) for t in _OUT]
    want = [np.zeros(n + h, t) for t in _OUT]
    table = store.table()
    attribute_stored(store.key_column(), table["ip"], table["ninsn"], table["mode"],
                     table["image"], *store.offset_steps(), *store.time_changes(), h, *threads,
                     *got[:-1])  # fmt: skip
    durations_of(got[6], got[9], stop_row, stop_tsc, conv)
    dense = [np.zeros(n, t) for t in (np.uint64, np.uint32, np.uint8, np.int64, np.int64,
                                      np.uint64)]  # fmt: skip
    assert store.drain(*dense) == n and len(store) == 0
    np.testing.assert_array_equal(dense[0], ip)
    np.testing.assert_array_equal(dense[4], offset)
    np.testing.assert_array_equal(dense[5], time)
    d_ip, d_ninsn, d_mode, d_image, d_offset, d_time = dense
    attribute_rows(d_ip, d_ninsn, d_mode, d_time, d_image, np.zeros(0, np.int32), d_offset, h,
                   *threads, *want[:-1])  # fmt: skip
    durations_of(want[6], want[9], stop_row, stop_tsc, conv)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), rest=st.integers(0, 40), held=st.booleans(),
       have_conv=st.booleans(), stops=st.integers(0, 6), ordered=st.booleans(),
       seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_time_and_duration_runs_are_the_rows_times_and_durations(n, rest, held, have_conv,
                                                                  stops, ordered, seed):  # fmt: skip
    """A batch's times and durations as runs (a held row, a block store's
    time points, rows written out after them), as a stream to Parquet
    gives them, are the rows' times and durations laid out."""
    from hwtrace.columns import Runs
    from hwtrace.session._attribution import duration_runs, time_runs

    rng = np.random.default_rng(seed)
    time = np.repeat(np.cumsum(rng.integers(0, 900, n)), rng.integers(1, 6, n))[:n]
    time = time.astype(np.uint64) + np.uint64(1 << 20)
    time[rng.random(n) < 0.03] = 0
    back = rng.random(n) < 0.02
    time[back] //= np.uint64(2)
    store = BlockStore(16)
    store.append(np.zeros(n, np.uint64), np.ones(n, np.uint32), np.zeros(n, np.uint8),
                 np.zeros(n, np.int64), time, image=0)  # fmt: skip
    conv = np.array([int(have_conv), 8, 300, 77], np.uint64)
    h = int(held)
    total = h + n + rest
    # The rows written out after the stored ones: their perf times, a row each.
    later = np.repeat(rng.integers(-1, 1 << 30, rest), rng.integers(1, 4, rest))[:rest]
    first = np.array([int(rng.integers(-1, 1 << 30))], np.int64) if held else None
    t_row, t_val = store.time_changes()
    starts, ns = time_runs(first, t_row, t_val, h, later.astype(np.int64), h + n, conv)
    # The same rows laid out: the stored ones' times as attribute_stored gives them.
    dense = np.zeros(total, np.int64)
    if held:
        dense[0] = first[0]
    outs = [np.zeros(total, t) for t in _OUT[:-1]]
    table = store.table()
    attribute_stored(store.key_column(), table["ip"], table["ninsn"], table["mode"],
                     table["image"], *store.offset_steps(), t_row, t_val, h, conv, 1, 1,
                     *(np.zeros(0, np.int64),) * 3, *outs)  # fmt: skip
    dense[h : h + n] = outs[6][h : h + n]
    dense[h + n :] = later
    runs = Runs(starts, ns, total)
    np.testing.assert_array_equal(np.asarray(runs), dense)
    assert (ns[1:] != ns[:-1]).all() and starts[0] == 0
    # Stops in order of rows, or not (a row's last stop counts), some at
    # the same row, some where a run of time ends.
    stop_row = rng.integers(0, total, stops).astype(np.int64)
    ends = starts[1:] - 1
    if ends.shape[0] and stops:
        stop_row[rng.random(stops) < 0.3] = rng.choice(ends)
    if stops > 1:
        stop_row[-1] = stop_row[0]
    if ordered:
        stop_row = np.sort(stop_row)
    stop_tsc = rng.integers(0, int(time.max()) + 2000, stops).astype(np.uint64)
    stop_tsc[rng.random(stops) < 0.3] = 0
    want = np.zeros(total, np.int64)
    durations_of(dense, want, stop_row, stop_tsc, conv)
    d_starts, d_values = duration_runs(starts, ns, total, stop_row, stop_tsc, conv)
    np.testing.assert_array_equal(np.asarray(Runs(d_starts, d_values, total)), want)
    assert d_starts[0] == 0 and (d_values[1:] != d_values[:-1]).all()


@settings(max_examples=60, deadline=None)
@given(points=st.lists(st.tuples(st.integers(0, 9), st.integers(-3, 40)), max_size=60),
       n=st.integers(1, 300), held=st.booleans(), first=st.integers(0, 50))  # fmt: skip
def test_offset_runs_are_the_rows_offsets(points, n, held, first):
    """The trace offsets as runs (changes at one row: the last holds; a
    step of 0 is no change) are those offsets_of lays out, a row each."""
    from hwtrace.columns import Runs
    from hwtrace.pt.blocks import OFF_BYTES, OFF_FAR, OFF_ROWS, offsets_of
    from hwtrace.session._attribution import offset_runs

    # The points as a store writes them (put_offset): a byte when the step
    # fits, else far (the row and offset); the first far.
    pts, far_row, far_val = [], [], []
    row, value = 0, 1000
    for i, (dr, dv) in enumerate([(0, 0), *points]):
        row, value = row + dr, value + dv
        if i and 0 <= dr < OFF_ROWS and 0 <= dv < OFF_BYTES:
            pts.append(dr << 4 | dv)
        else:
            pts.append(OFF_FAR)
            far_row.append(row)
            far_val.append(value)
    steps = (np.array(pts, np.uint8), np.array(far_row, np.int64), np.array(far_val, np.int64))
    at = 1 if held else 0
    total = n + at
    want = np.empty(total, np.int64)
    if held:
        want[0] = first
    offsets_of(*steps, n, want[at:])
    starts, values = offset_runs(first if held else None, *steps, at, total)
    assert starts[0] == 0 and (np.diff(starts) > 0).all() and (np.diff(values) != 0).all()
    assert np.array_equal(np.asarray(Runs(starts, values, total)), want)


_TYPES = st.sampled_from([0, 0, 1, 2, 3, 5, 6, 9, 16, 64, 65, 66])


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(_TYPES, st.integers(0, 15), st.integers(0, 1 << 40)),
                     max_size=40))  # fmt: skip
def test_stops_and_gaps_are_the_numpy_definition(rows):
    """The compiled pass over a stream's events finds the stops (block,
    time stamp) and gaps (and their kinds) gap_kinds and the numpy masks
    find."""
    from hwtrace.pt import flowrows as FK
    from hwtrace.session._attribution import stops_and_gaps

    ev = np.zeros((len(rows), FK.EW), np.uint64)
    for i, (t, f, tsc) in enumerate(rows):
        ev[i, FK.E_TYPE], ev[i, FK.E_FLAGS], ev[i, FK.E_TSC] = t, f, tsc
    blocks = np.arange(len(rows), dtype=np.int64) * 3 + 1
    is_stop = FK.type_table(np.array([FK.EV_DISABLED, FK.EV_ASYNC_DISABLED], np.uint64))
    types, flags = ev[:, FK.E_TYPE], ev[:, FK.E_FLAGS]
    real = (types < FK.X_ERROR) & ((flags & FK.F_STATUS) == 0)
    stop = real & FK.type_in(types, is_stop)
    want_t = np.where((flags[stop] & FK.F_HAS_TSC) != 0, ev[stop, FK.E_TSC], np.uint64(0))
    stop_k, stop_t, gap_k, gap_v, n_err, n_ptw, _ = stops_and_gaps(ev, blocks, is_stop)
    assert np.array_equal(stop_k, blocks[stop]) and np.array_equal(stop_t, want_t)
    kinds = FK.gap_kinds(ev)
    assert np.array_equal(gap_k, blocks[FK.gap_events(ev)])
    # (a stop with no enable after it waits for one: lost if none comes)
    assert np.array_equal(np.where(gap_v > FK.GAP_REJOINED, FK.GAP_LOST, gap_v), kinds[kinds != 0])
    assert n_err == int((types == FK.X_ERROR).sum())
    assert n_ptw == int((real & (types == FK.EV_PTWRITE)).sum())
